# A throwaway MariaDB 10.11 on a free loopback port, run as the mysql user in a temporary
# directory, like scripts/lib/postgres.sh. Source this file, then my_start [ENV_FILE] / my_stop.
# ENV_FILE, when given, receives the variables as shell assignments (for a my_start run in the
# background, side by side with another server's start: source the file afterwards).
# Sets MY_URI (mysql://idem@127.0.0.1:PORT/idem), MY_DIR, MY_PORT, MY_SOCK. A failure to start is
# fatal: tests never skip. my_crash / my_resume: SIGKILL the server, start it again on the same data.
# MY_TMPFS_MB (root only): the data directory is a tmpfs of that many MiB, which a test can fill
# (a full disk); my_stop unmounts it. MY_BUFFER_POOL_MB: InnoDB's buffer pool (default 128, the
# server's own default; scripts/bench uses 1024: InnoDB reads its pages directly, not through the
# operating system's cache that PostgreSQL's reads go through).
source "$(dirname "${BASH_SOURCE[0]}")/ports.sh"

my_as_mysql() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u mysql -- "$@"; else "$@"; fi
}

my_start() {
  MY_PORT=$(free_port 23306) || { echo "mariadb: no free port" >&2; return 1; }
  MY_DIR=$(mktemp -d /tmp/idem-my.XXXXXX)
  chmod 755 "$MY_DIR"
  [ "$(id -u)" -eq 0 ] && chown mysql:mysql "$MY_DIR"
  MY_SOCK="$MY_DIR/sock"
  local log_mb=64
  if [ -n "${MY_TMPFS_MB:-}" ]; then
    mkdir "$MY_DIR/data"
    mount -t tmpfs -o "size=${MY_TMPFS_MB}m,mode=755" tmpfs "$MY_DIR/data" || return 1
    chown mysql:mysql "$MY_DIR/data"
    log_mb=8
  fi
  # Durability as idem's sync mode requires it (checked at open by mysql_store):
  # innodb_flush_log_at_trx_commit=1; no binary log here, so sync_binlog does not apply.
  cat >"$MY_DIR/my.cnf" <<CONF
[mariadbd]
datadir = $MY_DIR/data
socket = $MY_SOCK
port = $MY_PORT
bind-address = 127.0.0.1
pid-file = $MY_DIR/pid
log-error = $MY_DIR/error.log
skip-name-resolve
innodb_flush_log_at_trx_commit = 1
innodb_buffer_pool_size = ${MY_BUFFER_POOL_MB:-128}M
innodb_log_file_size = ${log_mb}M
max_connections = 300
character-set-server = utf8mb4
collation-server = utf8mb4_bin
CONF
  [ "$(id -u)" -eq 0 ] && chown mysql:mysql "$MY_DIR/my.cnf"
  my_as_mysql mariadb-install-db --defaults-file="$MY_DIR/my.cnf" --auth-root-authentication-method=normal \
    --skip-test-db >"$MY_DIR/install.log" 2>&1 || { cat "$MY_DIR/install.log" >&2; return 1; }
  my_resume || return 1
  # A user of its own over TCP, every privilege (tests make databases of their own).
  mariadb --no-defaults -S "$MY_SOCK" -u root <<SQL || return 1
CREATE USER 'idem'@'127.0.0.1';
GRANT ALL PRIVILEGES ON *.* TO 'idem'@'127.0.0.1' WITH GRANT OPTION;
CREATE DATABASE idem;
SQL
  MY_URI="mysql://idem@127.0.0.1:$MY_PORT/idem"
  export MY_URI MY_DIR MY_PORT MY_SOCK
  [ -z "${1:-}" ] || printf 'MY_URI=%q\nMY_DIR=%q\nMY_PORT=%q\nMY_SOCK=%q\n' "$MY_URI" "$MY_DIR" "$MY_PORT" "$MY_SOCK" >"$1"
  echo "mariadb: running on $MY_URI (data in $MY_DIR)"
}

# my_resume: starts the server on MY_DIR's configuration and waits until it answers (60 s at most).
my_resume() {
  MY_SOCK="$MY_DIR/sock"
  local as=()
  # setpriv execs mariadbd as mysql (runuser would stay its parent, and stop with it on SIGSTOP).
  [ "$(id -u)" -eq 0 ] && as=(setpriv --reuid=mysql --regid=mysql --init-groups)
  # exec: no shell stays behind holding a copy of the caller's descriptors (a caller reading our
  # output through a pipe would never see its end).
  (exec "${as[@]}" mariadbd --defaults-file="$MY_DIR/my.cnf") </dev/null >>"$MY_DIR/stdout" 2>&1 &
  local i
  for i in $(seq 600); do
    mariadb-admin --no-defaults -S "$MY_SOCK" -u root ping >/dev/null 2>&1 && return 0
    kill -0 $! 2>/dev/null || break
    sleep 0.1
  done
  echo "mariadb: did not start" >&2; cat "$MY_DIR/error.log" >&2; return 1
}

# my_crash: SIGKILL, as a machine crash looks to the clients (InnoDB recovers at my_resume).
my_crash() {
  local pid; pid=$(cat "$MY_DIR/pid" 2>/dev/null) || return 0
  kill -CONT "$pid" 2>/dev/null || true
  kill -9 "$pid" 2>/dev/null || true
  # Gone, or a zombie nobody has reaped yet (its files are closed either way).
  while kill -0 "$pid" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]; do sleep 0.05; done
}

my_stop() {
  [ -n "${MY_DIR:-}" ] || return 0
  my_crash
  if mountpoint -q "$MY_DIR/data"; then
    # The server's last threads may still hold files a moment after its main thread is reaped:
    # retry (5 s at most), then detach lazily (freed once the last file closes).
    local i
    for i in $(seq 50); do umount "$MY_DIR/data" 2>/dev/null && break; sleep 0.1; done
    ! mountpoint -q "$MY_DIR/data" || umount -l "$MY_DIR/data"
  fi
  rm -rf "$MY_DIR"
  MY_DIR=
}
