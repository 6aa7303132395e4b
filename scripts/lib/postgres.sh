# A throwaway PostgreSQL 15 on a free loopback port, run as the postgres user in a temporary
# directory (PostgreSQL refuses to run as root). Source this file, then pg_start / pg_stop.
# Sets PG_URI, PG_DIR, PG_PORT, PG_BIN. A failure to start is fatal: tests never skip.
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}

pg_free_port() {
  local p
  for p in $(seq 55432 55532); do
    if ! (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null; then echo "$p"; return 0; fi
  done
  return 1
}

pg_as_postgres() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

pg_start() {
  PG_PORT=$(pg_free_port) || { echo "postgres: no free port" >&2; return 1; }
  PG_DIR=$(mktemp -d /tmp/idem-pg.XXXXXX)
  chmod 755 "$PG_DIR"
  [ "$(id -u)" -eq 0 ] && chown postgres:postgres "$PG_DIR"
  pg_as_postgres "$PG_BIN/initdb" -D "$PG_DIR/data" -A trust -U postgres >"$PG_DIR/initdb.log" 2>&1 \
    || { cat "$PG_DIR/initdb.log" >&2; return 1; }
  pg_as_postgres "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/log" -w -t 60 \
    -o "-k $PG_DIR -p $PG_PORT -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=on -c synchronous_commit=on" \
    start >/dev/null || { cat "$PG_DIR/log" >&2; return 1; }
  PG_URI="postgresql://postgres@127.0.0.1:$PG_PORT/postgres"
  export PG_URI PG_DIR PG_PORT PG_BIN
  echo "postgres: running on $PG_URI (data in $PG_DIR)"
}

pg_stop() {
  [ -n "${PG_DIR:-}" ] || return 0
  pg_as_postgres "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$PG_DIR"
  PG_DIR=
}
