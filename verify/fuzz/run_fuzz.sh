#!/usr/bin/env bash
# verify/fuzz/run_fuzz.sh: builds the libFuzzer targets with clang (ASan + UBSan) and runs each one for a
# bounded time, starting from a copy of its seed corpus in verify/fuzz/corpus/<target>/.
#
#   verify/fuzz/run_fuzz.sh [--build DIR] [--seconds N] [--jobs N] [--findings] [target ...]
#
#   --build DIR   build directory for the separate clang configuration (default: build/fuzz)
#   --seconds N   -max_total_time of each target (default 20; IDEM_FUZZ_SECONDS)
#   --jobs N      build parallelism (default 2)
#   --findings    instead of fuzzing, replay verify/fuzz/findings/ (reproducers of open findings, when
#                 there are any); exits non-zero while a finding still reproduces. A fixed finding's
#                 input moves to the corpus (verify/fuzz/corpus/<target>/regress-*), replayed by every run
#   target        fuzz_key, fuzz_recovery, fuzz_ops (default: all three)
#
# New corpus entries stay in the build directory (DIR/corpus/<target>); the repository's corpus is
# only read. A crash, leak, timeout or sanitizer report fails the run and leaves the input in
# DIR/artifacts/. Prints one line per target: executions, corpus size, coverage.
# Needs clang-14 and libclang-rt-14-dev (CC/CXX override the compilers), cmake, and the headers the
# library needs (libxxhash-dev, libsqlite3-dev).
set -euo pipefail

src=$(cd "$(dirname "$0")" && pwd)
build=""
seconds=${IDEM_FUZZ_SECONDS:-20}
jobs=2
findings=0
targets=()
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift ;;
    --seconds) seconds=$2; shift ;;
    --jobs) jobs=$2; shift ;;
    --findings) findings=1 ;;
    fuzz_*) targets+=("$1") ;;
    *) echo "usage: $0 [--build DIR] [--seconds N] [--jobs N] [--findings] [target ...]" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$build" ] || build=$src/../../build/fuzz
[ ${#targets[@]} -gt 0 ] || targets=(fuzz_key fuzz_recovery fuzz_ops)
export CC=${CC:-clang-14} CXX=${CXX:-clang++-14}
command -v "$CXX" >/dev/null || { echo "run_fuzz: $CXX not found (apt-get install clang-14 libclang-rt-14-dev)" >&2; exit 1; }

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
mkdir -p "$build"
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$src" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$build/configure.log" 2>&1 ||
    { cat "$build/configure.log"; exit 1; }
fi
cmake --build "$build" -j "$jobs" --target "${targets[@]}" >"$build/build.log" 2>&1 || { cat "$build/build.log"; exit 1; }

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

if [ $findings = 1 ]; then
  status=0
  for f in "$src"/findings/*; do
    [ -f "$f" ] || continue
    name=$(basename "$f")
    target=fuzz_${name%%-*}
    if "$build/$target" "$f" >"$build/finding-$name.log" 2>&1; then
      echo "finding $name: no longer reproduces"
    else
      echo "finding $name: reproduces ($(grep -a -m1 'runtime error\|ERROR:\|disagree\|non-idem exception\|(input ' "$build/finding-$name.log" | cut -c1-200))"
      status=1
    fi
  done
  exit $status
fi

status=0
mkdir -p "$build/artifacts"
for t in "${targets[@]}"; do
  corpus=$build/corpus/${t#fuzz_}
  mkdir -p "$corpus"
  cp -n "$src/corpus/${t#fuzz_}"/* "$corpus"/ 2>/dev/null || true
  log=$build/$t.log
  if "$build/$t" -max_total_time="$seconds" -timeout=25 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$build/artifacts/$t-" "$corpus" >"$log" 2>&1; then
    result=ok
  else
    result=FAILED
    status=1
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -a -o 'cov: [0-9]*' "$log" | tail -1)
  printf '%-14s %s: %s executions in %ss (%s/s), corpus %s inputs, %s\n' "$t" "$result" "${execs:-?}" "$seconds" \
    "${rate:-?}" "$(find "$corpus" -type f | wc -l)" "${cov:-cov: ?}"
  if [ $result = FAILED ]; then
    grep -a -m5 'runtime error\|ERROR:\|SUMMARY\|disagree\|non-idem exception\|(input ' "$log" | sed 's/^/    /' || true
    ls "$build/artifacts/$t-"* 2>/dev/null | sed 's/^/    input: /' || true
  fi
done
exit $status
