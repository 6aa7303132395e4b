# free_port FIRST: prints the first loopback port from FIRST to FIRST+100 that nothing listens on.
free_port() {
  local p
  for p in $(seq "$1" $(($1 + 100))); do
    if ! (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null; then echo "$p"; return 0; fi
  done
  return 1
}
