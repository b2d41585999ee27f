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

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
export RUST_BACKTRACE=1

echo "== build"
cargo build --workspace --all-targets --locked 2>&1 | tail -n 3

echo "== tests"
# Benches are compiled and run once each in test mode (fast) so they cannot rot.
cargo test --workspace --all-targets --locked
cargo test --workspace --doc --locked
