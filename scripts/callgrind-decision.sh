#!/usr/bin/env bash
# Instructions per decision (callgrind) of `tollgate serve`, gRPC, memory store, 64 callers: the
# gRPC row's callgrind pass of BENCHMARKS-HISTORY.md, for one or more binaries side by side. Instruction
# counts do not depend on the machine's load, so binaries built at different commits compare.
# With --http, the HTTP row's instead (`POST /v1/check`, as scripts/bench.sh --callgrind runs it).
#
# Usage: scripts/callgrind-decision.sh [--bin LABEL=PATH]... [--http] [--rules FILE] [--keys N]
#                                      [--descriptor 'user=user_{key}'] [--duration 5s]
#                                      [-- EXTRA SERVE ARGS]
# Prints one line per binary: LABEL instructions-per-decision (requests measured).
set -euo pipefail
cd "$(dirname "$0")/.."

BINS=()
RULES=benches/rules/high-limit.yaml
KEYS=10000
DESCRIPTOR='user=user_{key}'
DURATION=5s
EXTRA=()
SCHEME=grpc
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) BINS+=("$2"); shift ;;
    --http) SCHEME=http ;;
    --rules) RULES=$2; shift ;;
    --keys) KEYS=$2; shift ;;
    --descriptor) DESCRIPTOR=$2; shift ;;
    --duration) DURATION=$2; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "scripts/callgrind-decision.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[ ${#BINS[@]} -gt 0 ] || BINS=("tollgate=target/release/tollgate")
command -v valgrind >/dev/null && command -v callgrind_control >/dev/null \
  || { echo "needs valgrind (Debian package valgrind)" >&2; exit 1; }
OUT=$(mktemp -d /tmp/tollgate-callgrind.XXXXXX)
SERVER=""
cleanup() {
  [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$OUT"
}
trap cleanup EXIT

for spec in "${BINS[@]}"; do
  label=${spec%%=*}
  bin=${spec#*=}
  [ -x "$bin" ] || { echo "no executable $bin" >&2; exit 1; }
  log="$OUT/$label.log"
  valgrind --tool=callgrind --callgrind-out-file="$OUT/callgrind.$label" \
    "$bin" serve --http-addr 127.0.0.1:0 --grpc-addr 127.0.0.1:0 --rules "$RULES" \
    ${EXTRA[@]+"${EXTRA[@]}"} >"$log" 2>&1 &
  SERVER=$!
  addr=""
  for _ in $(seq 1 600); do
    if [ "$SCHEME" = http ]; then
      addr=$(sed -n 's/.*HTTP http:\/\/\([0-9.]*:[0-9]*\).*/\1/p' "$log" | head -1)
    else
      addr=$(sed -n 's/.*gRPC \([0-9.]*:[0-9]*\).*/\1/p' "$log" | head -1)
    fi
    [ -n "$addr" ] && break
    kill -0 "$SERVER" 2>/dev/null || { cat "$log" >&2; exit 1; }
    sleep 0.1
  done
  [ -n "$addr" ] || { echo "$label: the server never said where it listens" >&2; cat "$log" >&2; exit 1; }
  load() {
    "$bin" bench "$SCHEME://$addr" --json --concurrency 64 --keys "$KEYS" --domain bench \
      --descriptor "$DESCRIPTOR" --timeout 30s --duration "$1"
  }
  load 2s >/dev/null
  callgrind_control -z "$SERVER" >/dev/null 2>&1
  load "$DURATION" >"$OUT/$label.json"
  callgrind_control -d "$SERVER" >/dev/null 2>&1
  kill "$SERVER"
  wait "$SERVER" 2>/dev/null || true
  SERVER=""
  requests=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["requests"])' "$OUT/$label.json")
  dump=$(ls "$OUT"/callgrind."$label".* | sort -V | head -1)
  summary=$(sed -n 's/^summary: *//p' "$dump" | awk '{print $1}')
  python3 -c 'import sys; s, r = int(sys.argv[2]), int(sys.argv[3]); print(f"{sys.argv[1]} {s / r:,.0f} instructions per decision ({r} requests)")' \
    "$label" "$summary" "$requests"
done
