# A throwaway PostgreSQL 15 on a free loopback port, run as the postgres user in a temporary
# directory (PostgreSQL refuses to run as root). Source this file, then pg_start / pg_stop.
# Sets PG_URI, PG_DIR, PG_PORT, PG_BIN. A failure to start is fatal: tests never skip.
source "$(dirname "${BASH_SOURCE[0]}")/ports.sh"
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}

pg_as_postgres() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

pg_start() {
  PG_PORT=$(free_port 25432) || { echo "postgres: no free port" >&2; return 1; }
  PG_DIR=$(mktemp -d /tmp/idem-pg.XXXXXX)
  chmod 755 "$PG_DIR"
  [ "$(id -u)" -eq 0 ] && chown postgres:postgres "$PG_DIR"
  pg_as_postgres "$PG_BIN/initdb" -D "$PG_DIR/data" -A trust -U postgres >"$PG_DIR/initdb.log" 2>&1 \
    || { cat "$PG_DIR/initdb.log" >&2; return 1; }
  # In the configuration file, so that a plain pg_ctl start (pg_resume, after pg_crash) reuses them.
  cat >>"$PG_DIR/data/postgresql.conf" <<CONF
port = $PG_PORT
unix_socket_directories = '$PG_DIR'
listen_addresses = '127.0.0.1'
max_connections = 200
fsync = on
synchronous_commit = on
CONF
  pg_resume || return 1
  PG_URI="postgresql://postgres@127.0.0.1:$PG_PORT/postgres"
  export PG_URI PG_DIR PG_PORT PG_BIN
  echo "postgres: running on $PG_URI (data in $PG_DIR)"
}

# pg_crash: kills the server at once (no checkpoint, clients cut): what a machine crash looks like.
# pg_resume: starts it again on the same port and data (crash recovery runs first).
pg_crash() {
  pg_as_postgres "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m immediate stop >/dev/null
}
pg_resume() {
  pg_as_postgres "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/log" -w -t 60 start >/dev/null \
    || { cat "$PG_DIR/log" >&2; return 1; }
}

pg_stop() {
  [ -n "${PG_DIR:-}" ] || return 0
  pg_as_postgres "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$PG_DIR"
  PG_DIR=
}
