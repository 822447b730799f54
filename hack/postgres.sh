#!/usr/bin/env bash
# A throw-away PostgreSQL for the verify engine's differential oracle
# (haltsql/tests/engine_oracle.rs): Debian's packages, one cluster under
# .cache/postgres/, reachable only on a unix socket (no TCP listener).
#
#   hack/postgres.sh up       install (apt) if needed, initdb, start; prints the socket dir
#   hack/postgres.sh down     stop the server started by `up` and remove its data
#   hack/postgres.sh status   running / stopped
#   hack/postgres.sh env      `export HALTSQL_ORACLE_PGHOST=...` for the tests
#
# PostgreSQL refuses to run as root, so as root the server runs as the
# `postgres` system user that Debian's package creates.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="$root/.cache/postgres"
data="$dir/data"
sock="$dir/sock"
log="$dir/server.log"
pidfile="$dir/pid"
port=5432 # only names the socket file; there is no TCP listener

pg_bin() {
  local d
  d="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
  [ -n "$d" ] && [ -x "$d/pg_ctl" ] && echo "$d"
}

install() {
  if pg_bin >/dev/null && command -v sqlsmith >/dev/null; then return; fi
  if [ "$(id -u)" != 0 ]; then
    echo "postgres.sh: PostgreSQL or sqlsmith missing; run as root or: apt-get install -y postgresql sqlsmith" >&2
    exit 1
  fi
  echo ">> installing postgresql and sqlsmith (apt)" >&2
  apt-get update -qq >/dev/null
  # policy-rc.d keeps the package from starting its own cluster.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql sqlsmith >/dev/null
}

# Run a command as the server's user.
as_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

running() {
  [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

up() {
  install
  local bin
  bin="$(pg_bin)"
  if running; then echo "$sock"; return; fi
  rm -rf "$dir"
  mkdir -p "$data" "$sock"
  if [ "$(id -u)" = 0 ]; then chown -R postgres: "$dir"; fi
  as_pg "$bin/initdb" -D "$data" -U postgres -A trust -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 ||
    { cat "$dir/initdb.log" >&2; exit 1; }
  cat >>"$data/postgresql.conf" <<EOF
listen_addresses = ''
unix_socket_directories = '$sock'
port = $port
fsync = off
synchronous_commit = off
full_page_writes = off
max_connections = 20
shared_buffers = 32MB
log_min_messages = warning
EOF
  as_pg "$bin/pg_ctl" -D "$data" -l "$log" -w -t 60 start >/dev/null ||
    { cat "$log" >&2; exit 1; }
  head -n 1 "$data/postmaster.pid" >"$pidfile"
  echo "$sock"
}

down() {
  if running; then
    local pid
    pid="$(cat "$pidfile")"
    # SIGINT is PostgreSQL's "fast shutdown".
    kill -INT "$pid"
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then kill -QUIT "$pid" 2>/dev/null || true; fi
  fi
  rm -rf "$dir"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) if running; then echo "postgres: running (pid $(cat "$pidfile"), socket $sock)"; else echo "postgres: stopped"; fi ;;
  env) echo "export HALTSQL_ORACLE_PGHOST=$sock HALTSQL_ORACLE_PGPORT=$port" ;;
  *) echo "usage: $0 up|down|status|env" >&2; exit 2 ;;
esac
