# free_port FIRST: prints the first loopback port from FIRST to FIRST+100 that nothing listens on.
# Callers pick FIRST below Linux's ephemeral range (32768-60999 by default): a port there can be
# held at any moment as the local end of some client connection, and a server (re)started on it
# (pg_resume restarts on the same port) then fails to bind.
free_port() {
  local p
  for p in $(seq "$1" $(($1 + 100))); do
    if ! (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null; then echo "$p"; return 0; fi
  done
  return 1
}
