# verify/spin_search.sh: the search both SPIN runners share (run_spin.sh for idem.pml,
# run_spin_regions.sh for regions.pml). Source it, then call spin_search with the caller's globals:
#   model    the .pml file
#   work     a directory for the builds
#   cc       the C compiler
#   configs  entries "name|-D flags|property=holds|violated ..."
# Each configuration is compiled once per search kind it needs and searched once per property; the
# exit status of spin_search is 0 when every verdict is as expected.
spin_search() {
  local file; file=$(basename "$model")
  failures=0
  total_states=0
  total_runs=0
  printf '%-29s %-23s %-9s %-9s %12s %14s %8s\n' configuration property expected found states transitions seconds
  for entry in "${configs[@]}"; do
    IFS='|' read -r name flags props <<<"$entry"
    dir=$work/$name
    # Two builds: depth first for the properties expected to hold; breadth first, with the reach_*
    # witness flags compiled in (-DWITNESS), for those expected to be violated. Only those it needs.
    kinds=""
    [[ " $props" == *=holds* ]] && kinds="dfs"
    [[ " $props" == *=violated* ]] && kinds="$kinds bfs"
    for kind in $kinds; do
      mkdir -p "$dir/$kind"
      cp "$model" "$dir/$kind/$file"
      extra=""; ccextra=""
      [ $kind = bfs ] && { extra="-DWITNESS"; ccextra="-DBFS"; }
      # shellcheck disable=SC2086
      (cd "$dir/$kind" && spin -a $flags $extra "$file" >spin.log 2>&1) ||
        { echo "spin -a failed for $name:"; cat "$dir/$kind/spin.log"; exit 1; }
      # shellcheck disable=SC2086
      (cd "$dir/$kind" && $cc -w -O2 -DSAFETY $ccextra -DVECTORSZ=2048 -DMEMLIM=4000 -o pan pan.c) ||
        { echo "cc failed for $name"; exit 1; }
    done
    for pe in $props; do
      prop=${pe%=*}
      expect=${pe#*=}
      # A property expected to hold gets the depth-first search (with partial order reduction); one
      # expected to be violated gets the breadth-first one, whose counterexample is a shortest one.
      if [ "$expect" = holds ]; then run=$dir/dfs; else run=$dir/bfs; fi
      rm -f "$run"/*.trail
      out=$(cd "$run" && ./pan -m200000 -N "$prop" 2>&1) || true
      errors=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' <<<"$out" | head -1)
      states=$(sed -n 's/^ *\([0-9.e+]*\) states, stored.*/\1/p' <<<"$out" | head -1)
      trans=$(sed -n 's/^ *\([0-9.e+]*\) transitions.*/\1/p' <<<"$out" | head -1)
      secs=$(sed -n 's/^pan: elapsed time \([0-9.e+]*\) seconds.*/\1/p' <<<"$out" | head -1)
      if grep -q "out of memory\|max search depth too small" <<<"$out"; then
        found=incomplete
      elif [ "${errors:-1}" = 0 ]; then
        found=holds
      else
        found=violated
      fi
      printf '%-29s %-23s %-9s %-9s %12s %14s %8s\n' "$name" "$prop" "$expect" "$found" "${states:-?}" "${trans:-?}" "${secs:-?}"
      total_states=$(awk -v a="$total_states" -v b="${states:-0}" 'BEGIN { printf "%.0f", a + b }')
      total_runs=$((total_runs + 1))
      if [ "$found" != "$expect" ]; then
        failures=$((failures + 1))
        echo "  ^^ UNEXPECTED: $prop is $found in $name (expected $expect)"
        # shellcheck disable=SC2086
        [ "$found" = violated ] && (cd "$run" && spin -t $flags "$file" 2>&1 | grep 'MSC:' | sed 's/^ *MSC: /    /')
      elif [ "$found" = violated ] && [[ $prop != reach_* ]]; then
        echo "  counterexample ($name, $prop):"
        # shellcheck disable=SC2086
        (cd "$run" && spin -t $flags -DWITNESS "$file" 2>&1 | grep 'MSC:' | sed 's/^ *MSC: /    /')
      fi
    done
  done
  echo
  echo "spin: $total_runs searches, $total_states states stored in total, $failures unexpected verdicts"
  [ "$failures" = 0 ]
}
