#!/usr/bin/env bash
# The one test command: checks the toolchain, installs what is missing when it can, then runs
# every test in the workspace (unit, integration, property, CLI end-to-end, bench smoke runs).
# It never skips silently: anything missing that it cannot install is a failure with a message.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "scripts/test.sh: $*" >&2; exit 1; }

command -v cargo >/dev/null 2>&1 || die "cargo not found: install Rust from https://rustup.rs (1.85 or newer)"

# need_cmd CMD DEBIAN_PACKAGE: make sure CMD exists, installing the package via apt-get as root.
need_cmd() {
  command -v "$1" >/dev/null 2>&1 && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "scripts/test.sh: installing $2 (for $1)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null \
      || die "apt-get install $2 failed"
    command -v "$1" >/dev/null 2>&1 || die "$1 still missing after installing $2"
  else
    die "$1 is required: install the Debian package '$2' (or run this script as root to install it)"
  fi
}

# Redis: the store tests talk to a real server on 127.0.0.1:6379 and start their own
# (cluster, TLS, outage) from the redis-server binary.
need_cmd redis-server redis-server
need_cmd redis-cli redis-tools
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  echo "scripts/test.sh: no Redis on 127.0.0.1:6379, starting one for the tests"
  redis_dir=$(mktemp -d)
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
    --dir "$redis_dir" --pidfile "$redis_dir/redis.pid" --logfile "$redis_dir/redis.log" \
    || die "could not start redis-server on 127.0.0.1:6379"
  trap 'kill "$(cat "$redis_dir/redis.pid" 2>/dev/null)" 2>/dev/null; rm -rf "$redis_dir"' EXIT
  for _ in $(seq 50); do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && break; sleep 0.1; done
  redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 || die "redis-server did not answer on 127.0.0.1:6379"
fi

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
export RUST_BACKTRACE=1

# Each phase says when it starts and how long it took; cargo's own progress (one line per crate
# compiled) shows while it builds: a cold build takes minutes (see README.md).
started=$SECONDS
phase() { echo "== $* ($(date +%H:%M:%S), $((SECONDS - started)) s so far)"; }

phase "build: every crate, test and bench (cold: minutes, see README.md; warm: seconds)"
cargo build --workspace --all-targets --locked

phase "tests"
# Benches are compiled and run once each in test mode (fast) so they cannot rot.
cargo test --workspace --all-targets --locked
phase "doc tests"
cargo test --workspace --doc --locked
phase "done"
