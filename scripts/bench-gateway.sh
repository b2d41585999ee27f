#!/usr/bin/env bash
# Forward-auth cost (BENCHMARKS-HISTORY.md "Forward-auth behind nginx"), side by side in one run:
#   A  nginx -> API                      (a plain reverse proxy)
#   B  nginx -> tollgate -> API          (examples/nginx/nginx.conf: auth_request to tollgate)
#   C  tollgate's /v1/forward-auth alone (what nginx asks in B, sent directly)
# The API is a second nginx answering `200 ok` itself, so the upstream costs as little as possible
# and the difference between A and B is tollgate's round trip. Every request is allowed: the rules
# (written here) give each of 10,000 API keys and the client address a limit never reached, so B
# does the work of a real check (two descriptors, two counters) on every request.
# Rounds are interleaved (A B C, A B C, ...) so that drift of the machine hits all alike.
#
# Usage: scripts/bench-gateway.sh [--runs 3] [--duration 5s] [--concurrency 32] [--no-build]
#        (BENCH_BIN=path/to/tollgate with --no-build uses that binary)
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=3
DURATION=5s
CONCURRENCY=32
BUILD=1
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) RUNS=$2; shift ;;
    --duration) DURATION=$2; shift ;;
    --concurrency) CONCURRENCY=$2; shift ;;
    --no-build) BUILD=0 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "scripts/bench-gateway.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
command -v nginx >/dev/null || { echo "scripts/bench-gateway.sh: nginx is required (apt-get install nginx)" >&2; exit 1; }
BIN=${BENCH_BIN:-target/release/tollgate}   # BENCH_BIN: a release binary built elsewhere
if [ "$BUILD" = 1 ]; then
  cargo build --release --locked -p tollgate 2>&1 | tail -n 1
fi
[ -x "$BIN" ] || { echo "scripts/bench-gateway.sh: $BIN missing (drop --no-build)" >&2; exit 1; }

DIR=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for f in "$DIR"/*/nginx.pid; do [ -f "$f" ] && kill -QUIT "$(cat "$f")" 2>/dev/null || true; done
  sleep 0.5
  rm -rf "$DIR"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
P_API=$(free_port); P_ALONE=$(free_port); P_GW=$(free_port); P_TG=$(free_port); P_GRPC=$(free_port)

USER_LINE=""
[ "$(id -u)" = 0 ] && USER_LINE="user root;"
start_nginx() { # name config
  mkdir -p "$DIR/$1/logs"
  nginx -p "$DIR/$1" -c "$2" -e "$DIR/$1/error.log" -g "pid $DIR/$1/nginx.pid; $USER_LINE"
}

# The API: nginx answering itself.
cat > "$DIR/api.conf" <<EOF
worker_processes 1;
events { worker_connections 4096; }
http { access_log off; server { listen 127.0.0.1:$P_API; location / { return 200 "ok\n"; } } }
EOF
start_nginx api "$DIR/api.conf"

# A: nginx alone in front of the API (the example's proxy settings without auth_request).
cat > "$DIR/alone.conf" <<EOF
worker_processes 1;
events { worker_connections 4096; }
http {
  access_log off;
  upstream api { server 127.0.0.1:$P_API; keepalive 64; }
  server {
    listen 127.0.0.1:$P_ALONE;
    location / { proxy_pass http://api; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
EOF
start_nginx alone "$DIR/alone.conf"

# B: the shipped example, addresses replaced; the API upstream kept alive like A's.
sed -e "s/127.0.0.1:8000/127.0.0.1:$P_GW/; s/127.0.0.1:8080/127.0.0.1:$P_TG/; s/127.0.0.1:9000/127.0.0.1:$P_API/" \
    -e "s/server 127.0.0.1:$P_API;/server 127.0.0.1:$P_API; keepalive 64;/" \
    -e "s|proxy_pass http://api;|proxy_pass http://api; proxy_http_version 1.1; proxy_set_header Connection \"\";|" \
    examples/nginx/nginx.conf > "$DIR/gw.conf"
sed -i 's/worker_connections 1024;/worker_connections 4096;/' "$DIR/gw.conf"
start_nginx gw "$DIR/gw.conf"

cat > "$DIR/rules.yaml" <<'EOF'
domain: web
http:
  - actions: [{remote_address: {}}]
  - actions: [{request_headers: {header_name: x-api-key, descriptor_key: api_key}}]
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: api_key
    rate_limit: {unit: second, requests_per_unit: 1000000000, algorithm: gcra}
EOF
"$BIN" serve --rules "$DIR/rules.yaml" --http-addr "127.0.0.1:$P_TG" --grpc-addr "127.0.0.1:$P_GRPC" \
  --trusted-proxies 127.0.0.1/32 >"$DIR/tollgate.out" 2>"$DIR/tollgate.err" &
PIDS+=($!)
for _ in $(seq 100); do curl -s -o /dev/null "127.0.0.1:$P_TG/healthz" && break; sleep 0.1; done

echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); nginx $(nginx -v 2>&1 | cut -d/ -f2); $(git rev-parse --short HEAD)"
echo "load: $BIN bench --concurrency $CONCURRENCY --duration $DURATION --warmup 1s --keys 10000 --header 'X-Api-Key: k{key}'"
bench() { # label url
  local out
  out=$("$BIN" bench "$2" --concurrency "$CONCURRENCY" --duration "$DURATION" --warmup 1s --keys 10000 \
    --header 'X-Api-Key: k{key}' --json)
  python3 - "$1" "$out" <<'PY'
import json, sys
label, r = sys.argv[1], json.loads(sys.argv[2])
lat = r["latency_us"]
errs = r["errors"]
print(f"{label:28s} {r['throughput_rps']:>9.0f} req/s  p50 {lat['p50']/1000:.2f} ms  p99 {lat['p99']/1000:.2f} ms  allowed {r['allowed']} denied {r['denied']} errors {errs} {r['errors_by_kind'] if errs else ''}")
PY
}
for round in $(seq "$RUNS"); do
  echo "-- round $round"
  bench "A nginx -> API" "http://127.0.0.1:$P_ALONE/items"
  bench "B nginx -> tollgate -> API" "http://127.0.0.1:$P_GW/items"
  bench "C forward-auth alone" "http://127.0.0.1:$P_TG/v1/forward-auth/web"
done
