# A throwaway PostgreSQL 15 on a free loopback port, run as the postgres user in a temporary
# directory (PostgreSQL refuses to run as root). Source this file, then pg_start / pg_stop.
# Sets PG_URI, PG_DIR, PG_PORT, PG_BIN. A failure to start is fatal: tests never skip.
#
# A failover pair: pg_start, then pg_standby_start [sync] (a streaming standby of it, synchronous with
# `sync`), pg_kill (SIGKILL to the primary's postmaster and every backend: a machine that died) and
# pg_promote (the standby becomes the primary: what a failover manager does). PG_PAIR_URI names both
# hosts with target_session_attrs=read-write, so a client finds whichever one is the primary.
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
  # PG_EXTRA_CONF: more settings (lines of postgresql.conf), e.g. wal_level = logical for regions.
  if [ -n "${PG_EXTRA_CONF:-}" ]; then printf '%s\n' "$PG_EXTRA_CONF" >>"$PG_DIR/data/postgresql.conf"; fi
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

# pg_standby_start [sync]: a standby of the server pg_start started (PG_PORT), from a base backup,
# streaming in its own directory on its own free port, with application_name idem_standby. With
# `sync` the primary then waits for its flush at every commit (synchronous_standby_names, set after
# the base backup so that the standby, once promoted, does not wait for a standby of its own).
# Returns once the primary reports it streaming (and `sync`). Sets STANDBY_PORT, STANDBY_DIR,
# STANDBY_URI and PG_PAIR_URI.
pg_standby_start() {
  STANDBY_PORT=$(free_port 26432) || { echo "postgres: no free port for the standby" >&2; return 1; }
  STANDBY_DIR=$(mktemp -d /tmp/idem-pgs.XXXXXX)
  chmod 755 "$STANDBY_DIR"
  [ "$(id -u)" -eq 0 ] && chown postgres:postgres "$STANDBY_DIR"
  pg_as_postgres "$PG_BIN/pg_basebackup" -h 127.0.0.1 -p "$PG_PORT" -U postgres -D "$STANDBY_DIR/data" \
      -R -X stream -c fast >"$STANDBY_DIR/basebackup.log" 2>&1 \
    || { cat "$STANDBY_DIR/basebackup.log" >&2; return 1; }
  # postgresql.auto.conf is read last: these lines win over the primary's copied settings and over
  # the primary_conninfo that -R wrote.
  cat >>"$STANDBY_DIR/data/postgresql.auto.conf" <<CONF
port = $STANDBY_PORT
unix_socket_directories = '$STANDBY_DIR'
primary_conninfo = 'host=127.0.0.1 port=$PG_PORT user=postgres application_name=idem_standby'
# After the primary is lost the startup process retries the stream this often; a promotion that
# lands in the wait is answered at its end (default 5 s).
wal_retrieve_retry_interval = '200ms'
CONF
  pg_as_postgres "$PG_BIN/pg_ctl" -D "$STANDBY_DIR/data" -l "$STANDBY_DIR/log" -w -t 60 start >/dev/null \
    || { cat "$STANDBY_DIR/log" >&2; return 1; }
  local want=async
  if [ "${1:-}" = sync ]; then
    want=sync
    pg_psql "$PG_PORT" "ALTER SYSTEM SET synchronous_standby_names = 'idem_standby'" >/dev/null || return 1
    pg_psql "$PG_PORT" "SELECT pg_reload_conf()" >/dev/null || return 1
  fi
  local i state=
  for i in $(seq 1 600); do  # up to 60 s for the standby to connect and catch up
    state=$(pg_psql "$PG_PORT" "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'idem_standby' AND state = 'streaming'")
    [ "$state" = "$want" ] && break
    sleep 0.1
  done
  [ "$state" = "$want" ] || { echo "postgres: the standby is not $want (state '$state')" >&2; cat "$STANDBY_DIR/log" >&2; return 1; }
  STANDBY_URI="postgresql://postgres@127.0.0.1:$STANDBY_PORT/postgres"
  PG_PAIR_URI="postgresql://postgres@127.0.0.1:$PG_PORT,127.0.0.1:$STANDBY_PORT/postgres?target_session_attrs=read-write"
  export STANDBY_PORT STANDBY_DIR STANDBY_URI PG_PAIR_URI
  echo "postgres: $want standby on port $STANDBY_PORT (data in $STANDBY_DIR)"
}

# pg_psql PORT SQL: one statement on 127.0.0.1:PORT as postgres; prints the result, unaligned.
pg_psql() {
  pg_as_postgres "$PG_BIN/psql" -X -q -A -t -h 127.0.0.1 -p "$1" -U postgres -d postgres -v ON_ERROR_STOP=1 -c "$2"
}

# pg_kill [DIR]: SIGKILL to the postmaster of the server in DIR (default PG_DIR) and to all its
# children at once: no checkpoint, no shutdown record, no goodbye to clients or standbys.
pg_kill() {
  local dir=${1:-$PG_DIR} pm
  pm=$(head -1 "$dir/data/postmaster.pid") || return 1
  kill -9 "$pm" $(pgrep -P "$pm") 2>/dev/null || true
  local i
  # Dead once gone or a zombie (its parent may reap it late; a zombie holds no port or file).
  for i in $(seq 1 100); do
    kill -0 "$pm" 2>/dev/null || return 0
    [ "$(awk '{print $3}' "/proc/$pm/stat" 2>/dev/null)" != Z ] || return 0
    sleep 0.05
  done
  echo "postgres: postmaster $pm survived SIGKILL" >&2
  return 1
}

# pg_promote: the standby leaves recovery and accepts writes; returns when it does.
pg_promote() {
  pg_as_postgres "$PG_BIN/pg_ctl" -D "$STANDBY_DIR/data" -w -t 60 promote >/dev/null \
    || { cat "$STANDBY_DIR/log" >&2; return 1; }
}

# pg_standby_stop: stops and removes the standby (whatever it has become).
pg_standby_stop() {
  [ -n "${STANDBY_DIR:-}" ] || return 0
  pg_as_postgres "$PG_BIN/pg_ctl" -D "$STANDBY_DIR/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$STANDBY_DIR"
  STANDBY_DIR=
}

pg_stop() {
  [ -n "${PG_DIR:-}" ] || return 0
  pg_as_postgres "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$PG_DIR"
  PG_DIR=
}
