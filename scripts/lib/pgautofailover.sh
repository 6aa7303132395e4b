# A pg_auto_failover formation of the caller's own, on loopback: a monitor and two PostgreSQL 15
# nodes (a primary and a secondary that the monitor keeps synchronous), each run by its pg_autoctl
# keeper as the postgres user in a temporary directory. The failover manager is real: kill the
# primary's machine (paf_kill_primary: SIGKILL to its keeper and every PostgreSQL process of it) and
# the monitor promotes the secondary by itself. Source this file, then paf_start / paf_stop.
#
# Timeouts are lowered from pg_auto_failover's defaults so that a failover takes seconds, not half a
# minute, and kept in the order its safety needs: a primary's keeper that loses the monitor and its
# standby demotes itself after timeout.network_partition_timeout (1 s here, 20 s by default), and the
# monitor lets the promoted node accept writes only after pgautofailover.primary_demote_timeout (4 s
# here, 30 s by default), long after an isolated old primary stopped accepting them.
#
# Sets PAF_DIR, PAF_URI (both nodes, target_session_attrs=read-write: what clients use), PAF_MONITOR_PORT,
# PAF_PORT_1, PAF_PORT_2. A failure to start is fatal: tests never skip.
source "$(dirname "${BASH_SOURCE[0]}")/ports.sh"
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}

paf_as_postgres() {
  local env=(XDG_CONFIG_HOME="$PAF_DIR/xdg/config" XDG_DATA_HOME="$PAF_DIR/xdg/data"
             XDG_RUNTIME_DIR="$PAF_DIR/xdg/run" PG_CONFIG="$PG_BIN/pg_config" PATH="$PG_BIN:$PATH")
  if [ "$(id -u)" -eq 0 ]; then ${PAF_EXEC:+exec} runuser -u postgres -- env "${env[@]}" "$@"
  else ${PAF_EXEC:+exec} env "${env[@]}" "$@"; fi
}

# paf_psql PORT DB SQL: one statement as postgres; prints the result, unaligned.
paf_psql() {
  paf_as_postgres "$PG_BIN/psql" -X -q -A -t -h 127.0.0.1 -p "$1" -U postgres -d "$2" -v ON_ERROR_STOP=1 -c "$3"
}

# paf_run NAME ARGS...: a keeper (pg_autoctl ARGS) in a session of its own, logging to NAME.log; its
# session id goes to NAME.sid, so paf_kill can end it with every process it started.
# The background subshell execs at once: a subshell that stayed would keep the descriptors bash saved
# for the caller's redirections (a caller's pipe would then never see its end).
paf_run() {
  local name=$1; shift
  (PAF_EXEC=1 paf_as_postgres setsid bash -c 'echo $$ >"$0.sid"; exec "$@"' "$PAF_DIR/$name" pg_autoctl "$@") \
    >"$PAF_DIR/$name.log" 2>&1 </dev/null &
}

# paf_state: "name:reported:assigned" per node, from the monitor.
paf_state() {
  paf_psql "$PAF_MONITOR_PORT" pg_auto_failover \
    "SELECT string_agg(nodename || ':' || reportedstate || ':' || goalstate, ' ' ORDER BY nodeid) FROM pgautofailover.node"
}

# paf_wait STATE1 STATE2 [SECONDS]: waits until node_1 and node_2 report and are assigned these states.
paf_wait() {
  local want="node_1:$1:$1 node_2:$2:$2" i s=
  for i in $(seq 1 $((${3:-120} * 10))); do
    s=$(paf_state 2>/dev/null) || true
    [ "$s" = "$want" ] && return 0
    sleep 0.1
  done
  echo "pg_auto_failover: wanted '$want', have '$s'" >&2
  return 1
}

paf_start() {
  PAF_DIR=$(mktemp -d /tmp/idem-paf.XXXXXX)
  chmod 755 "$PAF_DIR"
  mkdir -p "$PAF_DIR/xdg/config" "$PAF_DIR/xdg/data" "$PAF_DIR/xdg/run"
  [ "$(id -u)" -eq 0 ] && chown -R postgres:postgres "$PAF_DIR"
  PAF_MONITOR_PORT=$(free_port 27432) || return 1
  echo "$PAF_MONITOR_PORT" >"$PAF_DIR/monitor.port"  # for callers that keep only PAF_DIR
  paf_as_postgres pg_autoctl create monitor --pgdata "$PAF_DIR/monitor" --pgport "$PAF_MONITOR_PORT" \
    --hostname 127.0.0.1 --listen 127.0.0.1 --auth trust --no-ssl >"$PAF_DIR/monitor-create.log" 2>&1 \
    || { cat "$PAF_DIR/monitor-create.log" >&2; return 1; }
  paf_run monitor run --pgdata "$PAF_DIR/monitor"
  local i
  for i in $(seq 1 300); do paf_psql "$PAF_MONITOR_PORT" pg_auto_failover "SELECT 1" >/dev/null 2>&1 && break; sleep 0.1; done
  local s
  for s in "pgautofailover.health_check_period TO 1000" "pgautofailover.health_check_timeout TO 1000" \
           "pgautofailover.health_check_retry_delay TO 500" "pgautofailover.health_check_max_retries TO 1" \
           "pgautofailover.node_considered_unhealthy_timeout TO 2000" "pgautofailover.primary_demote_timeout TO 4000"; do
    paf_psql "$PAF_MONITOR_PORT" pg_auto_failover "ALTER SYSTEM SET $s" >/dev/null || return 1
  done
  paf_psql "$PAF_MONITOR_PORT" pg_auto_failover "SELECT pg_reload_conf()" >/dev/null || return 1
  local monitor="postgres://autoctl_node@127.0.0.1:$PAF_MONITOR_PORT/pg_auto_failover?sslmode=disable"
  PAF_PORT_1=$(free_port 27532) || return 1
  paf_run node_1 create postgres --pgdata "$PAF_DIR/node_1" --pgport "$PAF_PORT_1" --hostname 127.0.0.1 \
    --name node_1 --listen 127.0.0.1 --auth trust --no-ssl --monitor "$monitor" --run
  paf_wait_one node_1 single || return 1
  PAF_PORT_2=$(free_port $((PAF_PORT_1 + 1))) || return 1
  paf_run node_2 create postgres --pgdata "$PAF_DIR/node_2" --pgport "$PAF_PORT_2" --hostname 127.0.0.1 \
    --name node_2 --listen 127.0.0.1 --auth trust --no-ssl --monitor "$monitor" --run
  paf_wait primary secondary || { tail -20 "$PAF_DIR"/node_*.log >&2; return 1; }
  for s in node_1 node_2; do
    paf_as_postgres pg_autoctl config set --pgdata "$PAF_DIR/$s" timeout.network_partition_timeout 1 >/dev/null || return 1
    paf_as_postgres pg_autoctl reload --pgdata "$PAF_DIR/$s" >/dev/null 2>&1 || true
  done
  PAF_URI="postgresql://postgres@127.0.0.1:$PAF_PORT_1,127.0.0.1:$PAF_PORT_2/postgres?target_session_attrs=read-write"
  export PAF_DIR PAF_URI PAF_MONITOR_PORT PAF_PORT_1 PAF_PORT_2
  echo "pg_auto_failover: monitor on $PAF_MONITOR_PORT, nodes on $PAF_PORT_1 (primary) and $PAF_PORT_2 (secondary), in $PAF_DIR"
}

# paf_wait_one NODE STATE: waits (60 s at most) until NODE reports and is assigned STATE.
paf_wait_one() {
  local i s=
  for i in $(seq 1 600); do
    s=$(paf_state 2>/dev/null) || true
    case " $s " in *" $1:$2:$2 "*) return 0 ;; esac
    sleep 0.1
  done
  echo "pg_auto_failover: $1 never reached $2 (have '$s')" >&2
  tail -20 "$PAF_DIR/$1.log" >&2
  return 1
}

# paf_primary: the node the monitor says is primary (node_1 or node_2); empty when none.
paf_primary() {
  paf_psql "$PAF_MONITOR_PORT" pg_auto_failover \
    "SELECT nodename FROM pgautofailover.node WHERE reportedstate IN ('primary', 'wait_primary') LIMIT 1"
}

# paf_kill NODE: SIGKILL to NODE's keeper and every process it started (its PostgreSQL): its machine died.
paf_kill() {
  local sid; sid=$(cat "$PAF_DIR/$1.sid") || return 1
  pkill -9 -s "$sid" || true
  local i
  for i in $(seq 1 100); do pgrep -s "$sid" >/dev/null || return 0; sleep 0.05; done
  echo "pg_auto_failover: processes of $1 survived SIGKILL" >&2
  return 1
}

# paf_kill_primary: kills the current primary; prints its name.
paf_kill_primary() {
  local p; p=$(paf_primary)
  [ -n "$p" ] || { echo "pg_auto_failover: no primary to kill" >&2; return 1; }
  paf_kill "$p" && echo "$p"
}

# paf_wait_writable [SECONDS]: waits until PAF_URI reaches a node that accepts writes; prints its port.
paf_wait_writable() {
  local i port
  for i in $(seq 1 $((${1:-120} * 10))); do
    port=$(paf_as_postgres "$PG_BIN/psql" -X -A -t "$PAF_URI&connect_timeout=2" \
             -c "SELECT inet_server_port() WHERE NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off'" 2>/dev/null) || true
    [ -n "$port" ] && { echo "$port"; return 0; }
    sleep 0.1
  done
  echo "pg_auto_failover: no writable node after ${1:-120} s ($(paf_state 2>/dev/null))" >&2
  return 1
}

paf_stop() {
  [ -n "${PAF_DIR:-}" ] || return 0
  local n sid i
  for n in node_1 node_2 monitor; do
    [ -f "$PAF_DIR/$n.sid" ] || continue
    sid=$(cat "$PAF_DIR/$n.sid")
    pkill -9 -s "$sid" 2>/dev/null || true  # already gone (a killed primary): nothing to do
    for i in $(seq 1 100); do pgrep -s "$sid" >/dev/null || break; sleep 0.05; done
  done
  rm -rf "$PAF_DIR"
  PAF_DIR=
}
