# A throwaway redis-server on a free loopback port, no persistence (a per-request idempotency check
# against Redis is usually run this way: a cache, not a store). Source this file, then redis_start /
# redis_stop. Sets REDIS_PORT and REDIS_DIR. A failure to start is fatal.
source "$(dirname "${BASH_SOURCE[0]}")/ports.sh"

redis_start() {
  REDIS_PORT=$(free_port 26379) || { echo "redis: no free port" >&2; return 1; }
  REDIS_DIR=$(mktemp -d /tmp/idem-redis.XXXXXX)
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
    --dir "$REDIS_DIR" --pidfile "$REDIS_DIR/redis.pid" --logfile "$REDIS_DIR/redis.log" \
    || { echo "redis: cannot start" >&2; return 1; }
  local i
  for i in $(seq 1 100); do
    if redis-cli -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG; then
      export REDIS_PORT REDIS_DIR
      echo "redis: running on 127.0.0.1:$REDIS_PORT"
      return 0
    fi
    sleep 0.1
  done
  cat "$REDIS_DIR/redis.log" >&2
  return 1
}

redis_stop() {
  [ -n "${REDIS_DIR:-}" ] || return 0
  redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
  rm -rf "$REDIS_DIR"
  REDIS_DIR=
}
