#!/usr/bin/env bash
# What a decision costs on the Redis store, side by side in one run: for each tollgate binary
# given (default target/release/tollgate), `tollgate serve` on the memory store and on a private
# redis-server, loaded by `tollgate bench` over gRPC (64 callers, 10,000 keys or --keys, the
# rules of benches/rules/high-limit.yaml or --rules), and per decision:
#   - the tollgate process's CPU (user + system, from /proc),
#   - redis-server's CPU (used_cpu_sys + used_cpu_user of INFO cpu), and its calls per decision
#     by command (INFO commandstats),
#   - decisions per second.
# Rounds interleave the binaries and stores; the median of --runs is reported. Each redis-server
# is started by this script on a free port and stopped at the end; nothing is kept.
# --callgrind runs redis-server under valgrind's callgrind and reports, instead of CPU time,
# the instructions redis-server executed per decision (repeatable, whatever the load; the
# server runs about 50 times slower, so use a short --duration).
# --stores takes `cluster` too: a private 3-master Redis Cluster (no replicas), its CPU and
# commands summed over the masters, so its figures compare with one server's.
# --pin runs redis-server on the last CPU and tollgate and the load generator on the others
# (taskset), so that Redis' CPU time is not shared with their cache and context switches: its
# figure varies less from round to round on a small machine (and the rate is lower).
#
# Usage: scripts/bench-redis-cost.sh [--bin LABEL=PATH]... [--runs N] [--duration 10s]
#                                    [--rules FILE] [--keys N] [--stores memory,redis,cluster]
#                                    [--redis-server PATH] [--callgrind] [--pin]
#                                    [-- EXTRA SERVE ARGS]
set -euo pipefail
cd "$(dirname "$0")/.."

BINS=()
RUNS=3
DURATION=10s
RULES=benches/rules/high-limit.yaml
KEYS=10000
STORES="memory,redis"
REDIS_SERVER=redis-server
CALLGRIND=0
PIN=0
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) BINS+=("$2"); shift ;;
    --runs) RUNS=$2; shift ;;
    --duration) DURATION=$2; shift ;;
    --rules) RULES=$2; shift ;;
    --keys) KEYS=$2; shift ;;
    --stores) STORES=$2; shift ;;
    --redis-server) REDIS_SERVER=$2; shift ;;
    --callgrind) CALLGRIND=1 ;;
    --pin) PIN=1 ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "scripts/bench-redis-cost.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[ ${#BINS[@]} -gt 0 ] || BINS=("tollgate=target/release/tollgate")
command -v "$REDIS_SERVER" >/dev/null || { echo "needs $REDIS_SERVER" >&2; exit 1; }
OUT=$(mktemp -d /tmp/tollgate-redis-cost.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$OUT"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
TICK=$(getconf CLK_TCK)

REDIS_PORT=$(free_port)
RUNNER=()
SIDE=()
if [ "$PIN" = 1 ]; then
  command -v taskset >/dev/null || { echo "--pin needs taskset" >&2; exit 1; }
  last=$(($(nproc) - 1))
  [ "$last" -ge 1 ] || { echo "--pin needs two CPUs" >&2; exit 1; }
  RUNNER=(taskset -c "$last")
  SIDE=(taskset -c "0-$((last - 1))")
fi
case ",$STORES," in
  *,cluster,*) [ "$CALLGRIND" = 0 ] || { echo "--callgrind measures one redis-server: not with the cluster store" >&2; exit 1; } ;;
esac
if [ "$CALLGRIND" = 1 ]; then
  command -v valgrind >/dev/null || { echo "--callgrind needs valgrind" >&2; exit 1; }
  RUNNER+=(valgrind --tool=callgrind --callgrind-out-file="$OUT/callgrind.%p")
fi
"${RUNNER[@]}" "$REDIS_SERVER" --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
  --daemonize no >"$OUT/redis.log" 2>&1 &
REDIS_PID=$!
PIDS+=("$REDIS_PID")
until redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; do
  kill -0 "$REDIS_PID" 2>/dev/null || { cat "$OUT/redis.log" >&2; exit 1; }
  sleep 0.1
done
# The cluster store: three masters, each on a free port in a directory of its own.
CLUSTER_PORTS=()
if [[ ",$STORES," == *,cluster,* ]]; then
  for i in 1 2 3; do
    # A cluster node's bus listens on its port + 10000.
    port=$(free_port)
    while [ "$port" -gt 55535 ]; do port=$(free_port); done
    mkdir -p "$OUT/node$i"
    (cd "$OUT/node$i" && exec "${RUNNER[@]}" "$REDIS_SERVER" --port "$port" --bind 127.0.0.1 --save '' \
      --appendonly no --cluster-enabled yes --cluster-config-file nodes.conf --daemonize no \
      >"$OUT/node$i/redis.log" 2>&1) &
    PIDS+=($!)
    CLUSTER_PORTS+=("$port")
    until redis-cli -p "$port" ping >/dev/null 2>&1; do
      kill -0 "${PIDS[-1]}" 2>/dev/null || { cat "$OUT/node$i/redis.log" >&2; exit 1; }
      sleep 0.1
    done
  done
  redis-cli --cluster create $(printf '127.0.0.1:%s ' "${CLUSTER_PORTS[@]}") --cluster-yes >/dev/null
  for port in "${CLUSTER_PORTS[@]}"; do
    until redis-cli -p "$port" CLUSTER INFO | grep -q cluster_state:ok; do sleep 0.1; done
  done
fi
# The ports of a store's Redis (a cluster: its masters).
redis_ports() { if [ "$1" = cluster ]; then echo "${CLUSTER_PORTS[@]}"; else echo "$REDIS_PORT"; fi; }
# Redis' CPU seconds (used_cpu_sys + used_cpu_user of INFO), summed over a cluster's masters.
redis_cpu() {
  local port
  for port in $(redis_ports "$1"); do redis-cli -p "$port" INFO cpu; done \
    | tr -d '\r' | awk -F: '/^used_cpu_(sys|user):/ { s += $2 } END { printf "%.6f\n", s }'
}
# Instructions redis-server executed since the last call (callgrind), or 0.
instructions() {
  [ "$CALLGRIND" = 1 ] || { echo 0; return; }
  rm -f "$OUT"/callgrind.*.*
  callgrind_control -d "$REDIS_PID" >/dev/null 2>&1
  awk '/^(summary|totals):/ {print $2; exit}' "$(ls -t "$OUT"/callgrind.*.* | head -n 1)"
}

# start LABEL BIN STORE: a server; sets SERVER_PID and GRPC.
start() {
  local label=$1 bin=$2 store=$3 args=()
  [ "$store" = redis ] && args+=(--store "redis://127.0.0.1:$REDIS_PORT")
  [ "$store" = cluster ] && args+=(--store "redis+cluster://$(printf '127.0.0.1:%s,' "${CLUSTER_PORTS[@]}" | sed 's/,$//')")
  "${SIDE[@]}" "$bin" serve --http-addr 127.0.0.1:0 --grpc-addr 127.0.0.1:0 --rules "$RULES" "${args[@]}" \
    "${EXTRA[@]}" >"$OUT/$label-$store.out" 2>"$OUT/$label-$store.err" &
  SERVER_PID=$!
  PIDS+=("$SERVER_PID")
  for _ in $(seq 200); do
    GRPC=$(sed -n 's/^listening.*gRPC \([^ ,)]*\), store.*/\1/p' "$OUT/$label-$store.out" 2>/dev/null | head -n 1)
    [ -n "$GRPC" ] && return 0
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  echo "$label ($store) did not start: $(tail -n 3 "$OUT/$label-$store.err")" >&2
  exit 1
}

GEN=${BINS[0]#*=}
bench() {
  "${SIDE[@]}" "$GEN" bench "grpc://$1" --domain bench --descriptor 'user=user_{key}' --keys "$KEYS" \
    --concurrency 64 --json "${@:2}"
}

echo "# $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg), $($REDIS_SERVER --version | cut -d' ' -f1-3)"
echo "# rules $RULES, $RUNS rounds of $DURATION, 64 callers, $KEYS keys${EXTRA[*]:+, serve ${EXTRA[*]}}$([ "$PIN" = 1 ] && echo ', pinned')"
for round in $(seq "$RUNS"); do
  for spec in "${BINS[@]}"; do
    label=${spec%%=*}; bin=${spec#*=}
    for store in ${STORES//,/ }; do
      start "$label" "$bin" "$store"
      bench "$GRPC" --duration 2s --warmup 0s >/dev/null
      for port in $(redis_ports "$store"); do redis-cli -p "$port" CONFIG RESETSTAT >/dev/null; done
      [ "$CALLGRIND" = 1 ] && callgrind_control -z "$REDIS_PID" >/dev/null 2>&1
      s0=$(cpu_ticks "$SERVER_PID"); r0=$(redis_cpu "$store")
      bench "$GRPC" --duration "$DURATION" --warmup 0s >"$OUT/run.json"
      s1=$(cpu_ticks "$SERVER_PID"); r1=$(redis_cpu "$store")
      ins=$(instructions)
      for port in $(redis_ports "$store"); do redis-cli -p "$port" INFO commandstats; done | tr -d '\r' >"$OUT/stats.txt"
      kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true
      python3 - "$OUT/run.json" "$OUT/stats.txt" "$s0" "$s1" "$r0" "$r1" "$TICK" \
        "$label" "$store" "$round" "$ins" >>"$OUT/rows.txt" <<'EOF'
import json, sys
run = json.load(open(sys.argv[1]))
s0, s1, r0, r1, tick = map(float, sys.argv[3:8])
ins = float(sys.argv[11])
n = run["allowed"] + run["denied"]
calls = {}
for line in open(sys.argv[2]):
    if line.startswith("cmdstat_"):
        name, rest = line[8:].split(":", 1)
        f = dict(kv.split("=") for kv in rest.strip().split(","))
        if name not in ("config|resetstat", "info"):
            calls[name] = calls.get(name, 0) + int(f["calls"])
per = ",".join(f"{k}={v / n:.3f}" for k, v in sorted(calls.items(), key=lambda kv: -kv[1]))
print(sys.argv[8], sys.argv[9], sys.argv[10], n / run["duration_s"],
      (s1 - s0) / tick * 1e6 / n, (r1 - r0) * 1e6 / n, per or "-", ins / n)
EOF
    done
  done
done
python3 - "$OUT/rows.txt" "$CALLGRIND" <<'EOF'
import sys, statistics as st
rows = {}
cg = sys.argv[2] == "1"
for line in open(sys.argv[1]):
    label, store, _round, rate, cpu, rcpu, per, ins = line.split()
    rows.setdefault((label, store), []).append((float(rate), float(cpu), float(rcpu), per, float(ins)))
if cg:
    print("| binary | store | decisions/s (under callgrind) | **redis-server instructions/decision** | Redis calls per decision | rounds |")
    print("|---|---|---:|---:|---|---|")
else:
    print("| binary | store | decisions/s | tollgate CPU µs/decision | redis-server CPU µs/decision | Redis calls per decision | rounds (tollgate µs / redis µs) |")
    print("|---|---|---:|---:|---:|---|---|")
for (label, store), rs in rows.items():
    med = lambda i: st.median(r[i] for r in rs)
    calls = rs[-1][3] if store != 'memory' else '-'
    if cg:
        rounds = ", ".join(f"{r[4]:,.0f}" for r in rs)
        ins = f"{med(4):,.0f}" if store != "memory" else "-"
        print(f"| {label} | {store} | {med(0):,.0f} | {ins} | {calls} | {rounds} |")
        continue
    rounds = ", ".join(f"{r[1]:.1f}/{r[2]:.1f}" for r in rs)
    redis = f"{med(2):.1f}" if store != "memory" else "-"
    print(f"| {label} | {store} | {med(0):,.0f} | {med(1):.1f} | {redis} | {calls} | {rounds} |")
EOF
