#!/usr/bin/env bash
# Service benchmarks, side by side in one run with one load generator (`tollgate bench`):
#   HTTP  /v1/check: bare axum ceiling vs `tollgate serve` (memory store), allowed and denied paths
#   gRPC  ShouldRateLimit: bare tonic ceiling vs `tollgate serve`
#   open loop at half of tollgate's measured maximum (p99), tollgate and the ceilings at that rate,
#   and each ceiling at half of its own maximum;
#   the machine's own stalls (busy-loop hiccups) and late wake-ups; idle RSS of `tollgate serve`
#   optional: --core (tollgate-core vs governor, short, plus paired rounds), --redis (Redis store vs redis-benchmark)
# Every scenario uses the same settings (64 connections, 10,000 keys uniform, 1 s warm-up) and
# runs --runs times (default 3); the median is reported. Raw JSON goes to --out (default
# target/bench-results/<date>). See BENCHMARKS-HISTORY.md "Service: HTTP and gRPC against their ceilings".
#
# --callgrind instead counts the server's instructions per request under valgrind (ceiling and
# tollgate, HTTP and gRPC): slow, but repeatable on a noisy machine where req/s are not.
#
# --peer PATH -- ARGS instead runs tollgate side by side with another Envoy RLS server (any
# binary; the defaults fit Kuadrant's limitador-server), see "Side by side with a peer" below.
#
# Usage: scripts/bench.sh [--runs N] [--duration 10s] [--quick] [--core] [--redis] [--callgrind]
#                         [--no-build] [--out DIR]
#        scripts/bench.sh --peer PATH [--rows LIST] [--peer-limits-high FILE] [--peer-limits-tight FILE]
#                         [--peer-store-memory WORDS] [--peer-store-redis WORDS] [--peer-http-path PATH]
#                         [--peer-http-body JSON] [--fill-keys N] [--no-callgrind] [--runs N] ... -- ARGS
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=3
DURATION=10s
WARMUP=1s
CONCURRENCY=64
KEYS=10000
CORE=0
REDIS=0
CALLGRIND=0
BUILD=1
PEER=""
PEER_ARGS=()
ROWS="grpc,grpc-hot,http,grpc-redis,redis-hot"
PEER_LIMITS_HIGH=""
PEER_LIMITS_TIGHT=""
PEER_STORE_MEMORY="memory"
PEER_STORE_REDIS="redis redis://127.0.0.1:6379"
PEER_HTTP_PATH="/check_and_report"
PEER_HTTP_BODY='{"namespace":"bench","values":{"user":"user_{key}"},"delta":1}'
FILL_KEYS=1000000
PEER_CALLGRIND=1
OUT="target/bench-results/$(date -u +%Y%m%dT%H%M%SZ)"
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) RUNS=$2; shift ;;
    --duration) DURATION=$2; shift ;;
    --quick) RUNS=1; DURATION=3s ;;
    --core) CORE=1 ;;
    --redis) REDIS=1 ;;
    --callgrind) CALLGRIND=1 ;;
    --no-build) BUILD=0 ;;
    --out) OUT=$2; shift ;;
    --peer) PEER=$2; shift ;;
    --rows) ROWS=$2; shift ;;
    --peer-limits-high) PEER_LIMITS_HIGH=$2; shift ;;
    --peer-limits-tight) PEER_LIMITS_TIGHT=$2; shift ;;
    --peer-store-memory) PEER_STORE_MEMORY=$2; shift ;;
    --peer-store-redis) PEER_STORE_REDIS=$2; shift ;;
    --peer-http-path) PEER_HTTP_PATH=$2; shift ;;
    --peer-http-body) PEER_HTTP_BODY=$2; shift ;;
    --fill-keys) FILL_KEYS=$2; shift ;;
    --no-callgrind) PEER_CALLGRIND=0 ;;
    --) shift; PEER_ARGS=("$@"); break ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "scripts/bench.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$OUT"
BIN=target/release/tollgate
if [ "$BUILD" = 1 ]; then
  echo "== cargo build --release"
  cargo build --release --locked -p tollgate 2>&1 | tail -n 1
fi
[ -x "$BIN" ] || { echo "scripts/bench.sh: $BIN missing (drop --no-build)" >&2; exit 1; }

# Server and load generator share the machine. With taskset and 2+ CPUs each gets its own core
# (server CPU 0, generator CPU 1), so a figure is "per server core" and runs are comparable.
PIN_SERVER=()
PIN_LOAD=()
if command -v taskset >/dev/null 2>&1 && [ "$(nproc)" -ge 2 ]; then
  PIN_SERVER=(taskset -c 0)
  PIN_LOAD=(taskset -c 1)
  PINNING="server on CPU 0, load generator on CPU 1 (taskset)"
else
  PINNING="no pinning (taskset missing or a single CPU): server and generator share all CPUs"
fi

{
  echo "date:    $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit:  $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  echo "load:    $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min load average before the run)"
  echo "pinning: $PINNING"
  echo "runs:    $RUNS x $DURATION (+$WARMUP warm-up), concurrency $CONCURRENCY, $KEYS keys uniform"
} | tee "$OUT/machine.txt"

# The machine's own stalls: a busy loop on each CPU, nothing else running, records every gap
# over 0.5 ms between two clock reads (jHiccup's idea). A virtual machine whose CPU is taken
# away for milliseconds at a time (not always reported as steal) puts those milliseconds in every
# tail latency below, the ceilings' included: read the p99 figures against this line.
if command -v python3 >/dev/null 2>&1; then
  for cpu in $(seq 0 $(($(nproc) - 1))); do
    taskset -c "$cpu" python3 -c "
import time
t = time.perf_counter(); end = t + 3; gaps = []
while t < end:
    n = time.perf_counter(); d = n - t; t = n
    if d > 0.0005: gaps.append(d)
print('stalls:  CPU $cpu: %d over 0.5 ms in 3 s, %.1f ms in all, worst %.1f ms'
      % (len(gaps), 1000 * sum(gaps), 1000 * max(gaps, default=0)))"
  done | tee -a "$OUT/machine.txt"
  # Wake-up lateness: a thread that sleeps 200 us at a time, as a server between requests does,
  # on each CPU at once. A busy loop keeps its virtual CPU running; a sleeper needs the host to
  # run its CPU again on time, and on a VM that can take a host scheduler tick. Each late wake
  # on the server's CPU delays every request that arrives meanwhile, and at 2/3 busy the queue
  # it leaves takes twice as long again to drain: this line bounds the open-loop p99 below.
  for cpu in $(seq 0 $(($(nproc) - 1))); do
    taskset -c "$cpu" python3 -c "
import time
end = time.perf_counter() + 3; late = []; n = 0
while True:
    t = time.perf_counter()
    if t > end: break
    time.sleep(0.0002); n += 1
    d = time.perf_counter() - t - 0.0002
    if d > 0.0005: late.append(d)
print('wakeups: CPU $cpu: %d of %d sleeps of 0.2 ms woke over 0.5 ms late in 3 s, worst %.1f ms'
      % (len(late), n, 1000 * max(late, default=0)))" &
  done > "$OUT/wakeups.txt"
  wait
  sort "$OUT/wakeups.txt" | tee -a "$OUT/machine.txt"
else
  echo "stalls:  not measured (python3 not found)" | tee -a "$OUT/machine.txt"
fi

# Servers started by this script (all stopped on exit).
PIDS=()
SERVER_PID=""
LISTEN=""
stop_all() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=()
}
trap stop_all EXIT

# start_server NAME ARGS...: run `tollgate ARGS` pinned, wait for its `listening:` line; sets
# SERVER_PID and LISTEN.
start_server() {
  local name=$1; shift
  "${PIN_SERVER[@]}" "$BIN" "$@" >"$OUT/$name.stdout" 2>"$OUT/$name.stderr" &
  SERVER_PID=$!
  PIDS+=("$SERVER_PID")
  for _ in $(seq 100); do
    if grep -q '^listening' "$OUT/$name.stdout" 2>/dev/null; then
      LISTEN=$(grep -m1 '^listening' "$OUT/$name.stdout")
      return 0
    fi
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  echo "scripts/bench.sh: $name did not start: $(tail -n 3 "$OUT/$name.stderr")" >&2
  kill "$SERVER_PID" 2>/dev/null || true
  wait "$SERVER_PID" 2>/dev/null || true
  return 1
}
stop_server() { kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; }
http_addr() { sed -n 's/.*HTTP http:\/\/\([^ ,)]*\).*/\1/p' <<<"$LISTEN"; }
grpc_addr() { sed -n 's/.*gRPC \([^ ,)]*\).*/\1/p' <<<"$LISTEN"; }

# json_num FILE FIELD: a top-level number, or a latency percentile with FIELD=latency_us.p99.
json_num() {
  local f=$1 key=$2
  case "$key" in
    latency_us.*) sed -n "s/.*\"latency_us\":{[^}]*\"${key#latency_us.}\":\([0-9.e+-]*\).*/\1/p" "$f" ;;
    *) sed -n "s/.*\"$key\":\([0-9.e+-]*\).*/\1/p" "$f" ;;
  esac
}
median() { sort -g | awk '{v[NR]=$1} END {if (NR==0) print "nan"; else if (NR%2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.0f%%", (b > 0) ? 100*a/b : 0}'; }
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
half() { awk -v r="$1" 'BEGIN {printf "%d", r/2}'; }

# CPU time (user + system) a process has used, in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
TICKS=$(getconf CLK_TCK)

# Scenarios: "NAME SERVER_PID TARGET [EXTRA ARGS...]" lines. Runs are interleaved (round 1 of
# every scenario, then round 2, ...) so background load hits ceiling and tollgate alike. Besides
# req/s, each run records the server's CPU time, giving requests per server CPU-second: on a
# machine shared with other work the server rarely gets its whole core, and that figure is much
# less sensitive to it than req/s.
SCENARIOS=()
# run_one NAME ROUND SERVER_PID KEYS TARGET [EXTRA ARGS...]: one `tollgate bench` run (pinned)
# into NAME.ROUND.json, and the server's CPU time over it into NAME.ROUND.cpu.json.
run_one() {
  local name=$1 r=$2 pid=$3 keys=$4 target=$5 c0 c1
  shift 5
  c0=$(cpu_ticks "$pid")
  "${PIN_LOAD[@]}" "$BIN" bench "$target" --json --duration "$DURATION" --warmup "$WARMUP" \
    --concurrency "$CONCURRENCY" --keys "$keys" --domain bench --descriptor 'user=user_{key}' \
    "$@" >"$OUT/$name.$r.json"
  c1=$(cpu_ticks "$pid")
  # Requests per CPU-second over the whole run (warm-up included in both counts).
  awk -v n="$(json_num "$OUT/$name.$r.json" requests)" -v d="$(json_num "$OUT/$name.$r.json" duration_s)" \
    -v w="${WARMUP%s}" -v t="$((c1 - c0))" -v hz="$TICKS" \
    'BEGIN {printf "{\"req_per_cpu_s\":%.0f,\"cpu_share\":%.2f}\n", (t > 0) ? n * (d + w) / d / (t / hz) : 0, t / hz / (d + w)}' \
    >"$OUT/$name.$r.cpu.json"
}
run_rounds() {
  local r line name pid target extra
  for r in $(seq "$RUNS"); do
    for line in "${SCENARIOS[@]}"; do
      read -r name pid target extra <<<"$line"
      # shellcheck disable=SC2086 # extra holds flags
      run_one "$name" "$r" "$pid" "$KEYS" "$target" $extra
    done
  done
}
# field NAME FIELD: median over the runs of NAME.
field() {
  local i
  local suffix=json
  case "$2" in req_per_cpu_s|cpu_share) suffix=cpu.json ;; esac
  for i in $(seq "$RUNS"); do json_num "$OUT/$1.$i.$suffix" "$2"; done | median
}
# summarize NAME: one line (median req/s with the range, p50/p99, denied share, errors).
summarize() {
  local name=$1 i f rps=() errors=0 denied=0 requests=0 behind=""
  for i in $(seq "$RUNS"); do
    f="$OUT/$name.$i.json"
    rps+=("$(json_num "$f" throughput_rps)")
    errors=$((errors + $(json_num "$f" errors)))
    denied=$((denied + $(json_num "$f" denied)))
    requests=$((requests + $(json_num "$f" requests)))
    grep -q '"kept_up":false' "$f" && behind="  FELL BEHIND THE SCHEDULE (run $i)"
  done
  printf '%-22s %6.0f req/s (runs %s)  %6.0f req/CPU-s (server CPU %.0f%%)  p50 %5.0f us  p99 %6.0f us  denied %5.1f%%  errors %d%s\n' \
    "$name" "$(field "$name" throughput_rps)" "$(printf '%.0f ' "${rps[@]}" | sed 's/ $//; s/ /, /g')" \
    "$(field "$name" req_per_cpu_s)" "$(awk -v s="$(field "$name" cpu_share)" 'BEGIN {print 100 * s}')" \
    "$(field "$name" latency_us.p50)" "$(field "$name" latency_us.p99)" \
    "$(awk -v d="$denied" -v r="$requests" 'BEGIN {print r ? 100*d/r : 0}')" "$errors" "$behind" \
    | tee -a "$OUT/summary.txt"
}

serve_args=(serve --http-addr 127.0.0.1:0 --grpc-addr 127.0.0.1:0)

# callgrind NAME SCHEME ARGS...: server `tollgate ARGS` under callgrind; after a warm-up run the
# counters are zeroed, a measured run follows, and the instructions of the whole server process
# (all threads) are divided by the requests answered.
callgrind() {
  local name=$1 scheme=$2; shift 2
  local saved=("${PIN_SERVER[@]}") addr ir req
  PIN_SERVER=(valgrind --tool=callgrind --callgrind-out-file="$OUT/callgrind.$name")
  start_server "cg-$name" "$@"
  PIN_SERVER=("${saved[@]}")
  if [ "$scheme" = http ]; then addr=$(http_addr); else addr=$(grpc_addr); fi
  local common=(--json --concurrency "$CONCURRENCY" --keys "$KEYS" --domain bench
    --descriptor 'user=user_{key}' --timeout 30s)
  "$BIN" bench "$scheme://$addr" "${common[@]}" --duration 2s >/dev/null
  callgrind_control -z "$SERVER_PID" >/dev/null 2>&1
  "$BIN" bench "$scheme://$addr" "${common[@]}" --duration "$DURATION" >"$OUT/cg-$name.json"
  callgrind_control -d "$SERVER_PID" >/dev/null 2>&1
  stop_server
  ir=$(sed -n 's/^summary: //p' "$OUT/callgrind.$name.1")
  req=$(json_num "$OUT/cg-$name.json" requests)
  CG_IR=$(awk -v i="$ir" -v r="$req" 'BEGIN {printf "%d", i/r}')
  printf '%-16s %8d instructions/request (%d requests, errors %s)\n' "$name" "$CG_IR" "$req" \
    "$(json_num "$OUT/cg-$name.json" errors)" | tee -a "$OUT/summary.txt"
}

# ---------------------------------------------------------------------------------------------
# Side by side with a peer (--peer PATH -- ARGS): tollgate and another Envoy RLS server, same
# rules, same generator, rounds interleaved (the order alternating every round, so both sides
# see the same drift of this shared machine). Rows (--rows, comma-separated):
#   grpc        gRPC ShouldRateLimit, memory store, 10,000 keys, limit never reached
#   grpc-hot    gRPC, memory store, one key, 1 per minute: all but the first request denied
#   http        the JSON check API, memory store (tollgate POST /v1/check; the peer
#               --peer-http-path with --peer-http-body, `{key}` replaced per request)
#   grpc-redis  gRPC, Redis store on 127.0.0.1:6379, 10,000 keys
#   redis-hot   gRPC, Redis store, one key, 1 per minute
# In ARGS, {grpc_port} and {http_port} become free ports, {limits} the peer's limits file for
# the row (--peer-limits-high / --peer-limits-tight; by default files in limitador's format are
# written to the output directory), and {store} the words of --peer-store-memory or
# --peer-store-redis. Each side gets its own server per row, pinned to CPU 0, the generator to
# CPU 1. On the grpc and http rows a third side runs too: the bare ceiling (`tollgate
# bench-ceiling`: the same stack answering without rate limiting), and on the http row a fourth,
# the floor (`tollgate bench-ceiling http-floor`: no HTTP stack, one read and one fixed write
# per request, the least any HTTP server costs on this machine). Reported per side and row: req/s, server CPU per decision (user + system time of the
# server process from /proc/PID/stat, over the run), p50/p99, the generator's own CPU; then p99
# open loop at half of the slower side's median; instructions per decision (callgrind); idle
# RSS and RSS after --fill-keys distinct keys.
peer_main() {
  [ -x "$PEER" ] || { echo "scripts/bench.sh: --peer $PEER is not an executable" >&2; exit 1; }
  [ "${#PEER_ARGS[@]}" -gt 0 ] || { echo "scripts/bench.sh: --peer needs the peer's arguments after --" >&2; exit 2; }
  command -v python3 >/dev/null 2>&1 || { echo "scripts/bench.sh: --peer needs python3 (free ports)" >&2; exit 1; }
  {
    echo "peer:    $PEER ${PEER_ARGS[*]}"
    echo "rows:    $ROWS"
  } | tee -a "$OUT/machine.txt"
  # The peer's limits in limitador's format, equivalent to benches/rules/*.yaml: one counter per
  # value of the descriptor entry `user`.
  if [ -z "$PEER_LIMITS_HIGH" ]; then
    PEER_LIMITS_HIGH="$OUT/peer-high-limit.yaml"
    printf '%s\n' '- namespace: bench' '  max_value: 1000000000' '  seconds: 1' '  conditions: []' \
      '  variables:' "    - descriptors[0]['user']" >"$PEER_LIMITS_HIGH"
  fi
  if [ -z "$PEER_LIMITS_TIGHT" ]; then
    PEER_LIMITS_TIGHT="$OUT/peer-tight-limit.yaml"
    printf '%s\n' '- namespace: bench' '  max_value: 1' '  seconds: 60' '  conditions: []' \
      '  variables:' "    - descriptors[0]['user']" >"$PEER_LIMITS_TIGHT"
  fi
  # Memory at --fill-keys live keys: counters that outlive the fill (an hour).
  printf '%s\n' '- namespace: bench' '  max_value: 1000000000' '  seconds: 3600' '  conditions: []' \
    '  variables:' "    - descriptors[0]['user']" >"$OUT/peer-fill.yaml"
  printf '%s\n' 'domain: bench' 'descriptors:' '  - key: user' '    rate_limit:' '      unit: hour' \
    '      requests_per_unit: 1000000000' >"$OUT/tollgate-fill.yaml"

  local rows row
  IFS=, read -r -a rows <<<"$ROWS"
  for row in "${rows[@]}"; do
    case "$row" in grpc|grpc-hot|http|grpc-redis|redis-hot) ;;
      *) echo "scripts/bench.sh: unknown row $row (grpc, grpc-hot, http, grpc-redis, redis-hot)" >&2; exit 2 ;;
    esac
  done
  if [[ ",$ROWS," == *,grpc-redis,* || ",$ROWS," == *,redis-hot,* ]] \
    && ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
    echo "scripts/bench.sh: the Redis rows need a Redis on 127.0.0.1:6379" >&2
    exit 1
  fi

  # Start both sides of every row (all idle but the one under load).
  declare -gA T_PID T_TARGET P_PID P_TARGET C_PID C_TARGET F_PID F_TARGET
  for row in "${rows[@]}"; do
    start_side tollgate "$row" "${PIN_SERVER[@]}"
    T_PID[$row]=$SIDE_PID; T_TARGET[$row]=$SIDE_TARGET
    start_side peer "$row" "${PIN_SERVER[@]}"
    P_PID[$row]=$SIDE_PID; P_TARGET[$row]=$SIDE_TARGET
    if has_ceiling "$row"; then
      start_side ceiling "$row" "${PIN_SERVER[@]}"
      C_PID[$row]=$SIDE_PID; C_TARGET[$row]=$SIDE_TARGET
    fi
    if has_floor "$row"; then
      start_side floor "$row" "${PIN_SERVER[@]}"
      F_PID[$row]=$SIDE_PID; F_TARGET[$row]=$SIDE_TARGET
    fi
  done
  sleep 1
  local t_idle p_idle
  t_idle=$(rss_kb "${T_PID[${rows[0]}]}"); p_idle=$(rss_kb "${P_PID[${rows[0]}]}")

  echo "== closed loop, $RUNS interleaved rounds (order alternating)"
  local r side
  for r in $(seq "$RUNS"); do
    for row in "${rows[@]}"; do
      for side in $(side_order "$row" "$r"); do run_side "$side" "$row" "$r"; done
    done
  done
  for row in "${rows[@]}"; do
    peer_line "$row" tollgate; peer_line "$row" peer
    if has_ceiling "$row"; then peer_line "$row" ceiling; fi
    if has_floor "$row"; then peer_line "$row" floor; fi
  done

  echo "== open loop at half of the slower side's median req/s, $RUNS interleaved rounds"
  declare -gA RATE
  local open_rows=()
  for row in "${rows[@]}"; do
    case "$row" in *hot) continue ;; esac
    RATE[$row]=$(half "$(printf '%s\n' "$(field "$row-tollgate" throughput_rps)" "$(field "$row-peer" throughput_rps)" | sort -g | head -n 1)")
    open_rows+=("$row")
  done
  for r in $(seq "$RUNS"); do
    for row in "${open_rows[@]}"; do
      for side in $(side_order "$row" "$r"); do run_side "$side" "$row" "$r" open --rate "${RATE[$row]}"; done
    done
  done
  stop_all

  declare -gA T_CG P_CG C_CG F_CG
  if [ "$PEER_CALLGRIND" = 1 ] && command -v valgrind >/dev/null 2>&1; then
    echo "== instructions per decision (callgrind, server process only)"
    for row in "${rows[@]}"; do
      cg_side tollgate "$row"; T_CG[$row]=$CG_IR
      cg_side peer "$row"; P_CG[$row]=$CG_IR
      if has_ceiling "$row"; then cg_side ceiling "$row"; C_CG[$row]=$CG_IR; fi
      if has_floor "$row"; then cg_side floor "$row"; F_CG[$row]=$CG_IR; fi
    done
  fi

  local t_fill="" p_fill=""
  if [ "$FILL_KEYS" -gt 0 ]; then
    echo "== RSS after $FILL_KEYS distinct keys (gRPC, memory store, counters living an hour)"
    t_fill=$(fill_side tollgate); p_fill=$(fill_side peer)
  fi

  peer_report "$t_idle" "$p_idle" "$t_fill" "$p_fill" "${rows[@]}"
}

# free_port: a TCP port free on 127.0.0.1 right now.
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# wait_port PORT PID: until something accepts on 127.0.0.1:PORT (or PID died).
wait_port() {
  for _ in $(seq 600); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
row_tight() { case "$1" in *hot) return 0 ;; *) return 1 ;; esac; }
row_redis() { case "$1" in *redis*) return 0 ;; *) return 1 ;; esac; }
row_keys() { if row_tight "$1"; then echo 1; else echo "$KEYS"; fi; }
has_ceiling() { [ "$1" = grpc ] || [ "$1" = http ]; }
has_floor() { [ "$1" = http ]; }
# side_order ROW ROUND: the sides of ROW in the order of this round (rotating, so no side is
# always first after the other's load).
side_order() {
  local sides=(tollgate peer) n i
  if has_ceiling "$1"; then sides+=(ceiling); fi
  if has_floor "$1"; then sides+=(floor); fi
  n=${#sides[@]}
  for i in $(seq 0 $((n - 1))); do echo "${sides[$(((i + $2 - 1) % n))]}"; done
}

# start_side tollgate|peer ROW [WRAPPER...]: the side's server for ROW, run under WRAPPER
# (taskset, valgrind); sets SIDE_PID and SIDE_TARGET (the URL, then extra generator flags).
# ROW fill: memory store, counters living an hour.
start_side() {
  local side=$1 row=$2 name="$1-$2"
  shift 2
  local wrap=("$@") rules=benches/rules/high-limit.yaml limits=$PEER_LIMITS_HIGH
  if row_tight "$row"; then rules=benches/rules/tight-limit.yaml; limits=$PEER_LIMITS_TIGHT; fi
  if [ "$row" = fill ]; then rules=$OUT/tollgate-fill.yaml; limits=$OUT/peer-fill.yaml; fi
  if [ "$side" = ceiling ] || [ "$side" = floor ]; then
    local saved=("${PIN_SERVER[@]}") kind=grpc
    if [ "$row" = http ]; then kind=http; fi
    if [ "$side" = floor ]; then kind=http-floor; fi
    PIN_SERVER=("${wrap[@]}")
    start_server "$name" bench-ceiling "$kind" --addr 127.0.0.1:0
    PIN_SERVER=("${saved[@]}")
    SIDE_PID=$SERVER_PID
    if [ "$row" = http ]; then SIDE_TARGET="http://$(http_addr)"; else SIDE_TARGET="grpc://$(grpc_addr)"; fi
    return 0
  fi
  if [ "$side" = tollgate ]; then
    local store=()
    if row_redis "$row"; then store=(--store redis://127.0.0.1:6379); fi
    local saved=("${PIN_SERVER[@]}")
    PIN_SERVER=("${wrap[@]}")
    start_server "$name" "${serve_args[@]}" --rules "$rules" "${store[@]}"
    PIN_SERVER=("${saved[@]}")
    SIDE_PID=$SERVER_PID
    if [ "$row" = http ]; then SIDE_TARGET="http://$(http_addr)"; else SIDE_TARGET="grpc://$(grpc_addr)"; fi
    return 0
  fi
  local gp hp store_words a args=()
  gp=$(free_port); hp=$(free_port)
  store_words=$PEER_STORE_MEMORY
  if row_redis "$row"; then store_words=$PEER_STORE_REDIS; fi
  for a in "${PEER_ARGS[@]}"; do
    if [ "$a" = "{store}" ]; then
      # shellcheck disable=SC2206 # the store is given as words
      args+=($store_words)
      continue
    fi
    a=${a//\{grpc_port\}/$gp}; a=${a//\{http_port\}/$hp}; a=${a//\{limits\}/$limits}
    args+=("$a")
  done
  "${wrap[@]}" "$PEER" "${args[@]}" >"$OUT/$name.stdout" 2>"$OUT/$name.stderr" &
  SIDE_PID=$!
  PIDS+=("$SIDE_PID")
  local port=$gp
  if [ "$row" = http ]; then port=$hp; fi
  if ! wait_port "$port" "$SIDE_PID"; then
    echo "scripts/bench.sh: the peer ($name) did not listen on $port: $(tail -n 3 "$OUT/$name.stderr")" >&2
    exit 1
  fi
  if [ "$row" = http ]; then SIDE_TARGET="http://127.0.0.1:$hp$PEER_HTTP_PATH"; else SIDE_TARGET="grpc://127.0.0.1:$gp"; fi
}

# side_flags ROW SIDE: extra generator flags (the peer's JSON body on the http row).
side_flags() {
  if [ "$1" = http ] && [ "$2" = peer ]; then printf '%s\n' --body "$PEER_HTTP_BODY"; fi
}

# run_side SIDE ROW ROUND [open --rate R]: one run of ROW against SIDE's server.
run_side() {
  local side=$1 row=$2 r=$3 mode="" pid target flags=()
  shift 3
  if [ "${1:-}" = open ]; then mode=-open; shift; fi
  case "$side" in
    tollgate) pid=${T_PID[$row]}; target=${T_TARGET[$row]} ;;
    peer) pid=${P_PID[$row]}; target=${P_TARGET[$row]} ;;
    ceiling) pid=${C_PID[$row]}; target=${C_TARGET[$row]} ;;
    floor) pid=${F_PID[$row]}; target=${F_TARGET[$row]} ;;
  esac
  mapfile -t flags < <(side_flags "$row" "$side")
  run_one "$row$mode-$side" "$r" "$pid" "$(row_keys "$row")" "$target" "${flags[@]}" "$@"
}

# runs NAME FIELD: every run's figure, comma-separated.
runs() {
  local i suffix=json
  case "$2" in req_per_cpu_s|cpu_share) suffix=cpu.json ;; esac
  for i in $(seq "$RUNS"); do json_num "$OUT/$1.$i.$suffix" "$2"; done | awk '{printf "%s%.0f", (NR > 1) ? ", " : "", $1}'
}
# us_per_decision REQ_PER_CPU_S: server CPU microseconds per decision.
us_per() { awk -v r="$1" 'BEGIN {printf "%.1f", (r > 0) ? 1e6 / r : 0}'; }

# peer_line ROW SIDE: one summary line of the closed-loop rounds.
peer_line() {
  local name="$1-$2" i cpu=()
  for i in $(seq "$RUNS"); do cpu+=("$(us_per "$(json_num "$OUT/$name.$i.cpu.json" req_per_cpu_s)")"); done
  printf '%-22s %7.0f req/s (runs %s)  server CPU %s us/decision (runs %s)  p50 %5.0f us  p99 %6.0f us  denied %3.0f%%  errors %s  generator CPU %.0f%%\n' \
    "$name" "$(field "$name" throughput_rps)" "$(runs "$name" throughput_rps)" \
    "$(us_per "$(field "$name" req_per_cpu_s)")" "$(IFS=/; echo "${cpu[*]}")" \
    "$(field "$name" latency_us.p50)" "$(field "$name" latency_us.p99)" \
    "$(awk -v d="$(field "$name" denied)" -v r="$(field "$name" requests)" 'BEGIN {print r ? 100 * d / r : 0}')" \
    "$(runs "$name" errors)" "$(awk -v s="$(field "$name" generator_cpu_share)" 'BEGIN {print 100 * s}')" \
    | tee -a "$OUT/summary.txt"
}

# cg_side SIDE ROW: instructions per decision of SIDE's server on ROW under callgrind (warm-up
# run, counters zeroed, measured run, all threads of the server process); sets CG_IR.
cg_side() {
  local side=$1 row=$2 name="cg-$1-$2" ir req flags=()
  start_side "$side" "$row" valgrind --tool=callgrind --callgrind-out-file="$OUT/callgrind.$side-$row"
  mapfile -t flags < <(side_flags "$row" "$side")
  local common=(--json --concurrency "$CONCURRENCY" --keys "$(row_keys "$row")" --domain bench
    --descriptor 'user=user_{key}' --timeout 30s "${flags[@]}")
  "$BIN" bench "$SIDE_TARGET" "${common[@]}" --duration 2s >/dev/null
  callgrind_control -z "$SIDE_PID" >/dev/null 2>&1
  "$BIN" bench "$SIDE_TARGET" "${common[@]}" --duration 5s >"$OUT/$name.json"
  callgrind_control -d "$SIDE_PID" >/dev/null 2>&1
  stop_all
  ir=$(sed -n 's/^summary: //p' "$OUT/callgrind.$side-$row.1" 2>/dev/null | head -n 1)
  [ -n "$ir" ] || ir=$(sed -n 's/^summary: //p' "$OUT/callgrind.$side-$row" 2>/dev/null | head -n 1)
  req=$(json_num "$OUT/$name.json" requests)
  CG_IR=$(awk -v i="${ir:-0}" -v r="$req" 'BEGIN {printf "%d", r ? i / r : 0}')
  printf '%-24s %8d instructions/decision (%d requests, errors %s)\n' "$side $row" "$CG_IR" "$req" \
    "$(json_num "$OUT/$name.json" errors)" | tee -a "$OUT/summary.txt"
}

# fill_side SIDE: RSS (KiB) of SIDE's server after FILL_KEYS distinct keys (sequential keys,
# runs of 20 s continuing where the last stopped, until FILL_KEYS requests are answered).
fill_side() {
  local side=$1 done=0 n
  start_side "$side" fill "${PIN_SERVER[@]}"
  while [ "$done" -lt "$FILL_KEYS" ]; do
    "${PIN_LOAD[@]}" "$BIN" bench "$SIDE_TARGET" --json --duration 20s --concurrency "$CONCURRENCY" \
      --keys "$FILL_KEYS" --distribution sequential --seed "$done" --domain bench \
      --descriptor 'user=user_{key}' --timeout 5s >"$OUT/fill-$side.json"
    n=$(json_num "$OUT/fill-$side.json" requests)
    [ "${n:-0}" -gt 0 ] || break
    done=$((done + n))
  done
  sleep 1
  rss_kb "$SIDE_PID"
  echo "fill $side: $done requests over $FILL_KEYS keys, RSS $(rss_kb "$SIDE_PID") KiB" >>"$OUT/summary.txt"
  stop_all
}

# peer_report T_IDLE P_IDLE T_FILL P_FILL ROWS...: the Markdown table (BENCHMARKS.md's first).
peer_report() {
  local t_idle=$1 p_idle=$2 t_fill=$3 p_fill=$4 row t p i ratios
  shift 4
  {
    echo
    echo "| path (median of $RUNS) | req/s tollgate / peer / ceiling | server CPU us/decision tollgate | peer | ceiling | **peer CPU / tollgate CPU** (per round) | p99 tollgate / peer | instr/decision tollgate / peer / ceiling |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|"
    for row in "$@"; do
      t=$(field "$row-tollgate" req_per_cpu_s); p=$(field "$row-peer" req_per_cpu_s)
      ratios=$(for i in $(seq "$RUNS"); do
        awk -v a="$(json_num "$OUT/$row-tollgate.$i.cpu.json" req_per_cpu_s)" \
          -v b="$(json_num "$OUT/$row-peer.$i.cpu.json" req_per_cpu_s)" 'BEGIN {printf "%.2f\n", b ? a / b : 0}'
      done)
      local c_rps="-" c_cpu="-"
      if has_ceiling "$row"; then
        c_rps=$(printf '%.0f' "$(field "$row-ceiling" throughput_rps)")
        c_cpu=$(us_per "$(field "$row-ceiling" req_per_cpu_s)")
      fi
      printf '| %s | %.0f / %.0f / %s | %s | %s | %s | **%.2fx** (%s) | %.2f / %.2f ms | %s / %s / %s |\n' "$row" \
        "$(field "$row-tollgate" throughput_rps)" "$(field "$row-peer" throughput_rps)" "$c_rps" \
        "$(us_per "$t")" "$(us_per "$p")" "$c_cpu" "$(median <<<"$ratios")" "$(paste -sd, <<<"$ratios" | sed 's/,/, /g')" \
        "$(awk -v v="$(field "$row-tollgate" latency_us.p99)" 'BEGIN {print v / 1000}')" \
        "$(awk -v v="$(field "$row-peer" latency_us.p99)" 'BEGIN {print v / 1000}')" \
        "${T_CG[$row]:-n/a}" "${P_CG[$row]:-n/a}" "${C_CG[$row]:--}"
    done
    echo
    for row in "$@"; do
      has_floor "$row" || continue
      printf '%s floor (no HTTP stack: one read, one fixed write): %s us/decision (runs %s), %s instr/decision; 2x the peer would need %s us\n' \
        "$row" "$(us_per "$(field "$row-floor" req_per_cpu_s)")" \
        "$(for i in $(seq "$RUNS"); do us_per "$(json_num "$OUT/$row-floor.$i.cpu.json" req_per_cpu_s)"; echo; done | paste -sd/)" \
        "${F_CG[$row]:-n/a}" "$(awk -v p="$(field "$row-peer" req_per_cpu_s)" 'BEGIN {printf "%.1f", p ? 1e6 / p / 2 : 0}')"
    done
    for row in "$@"; do
      case "$row" in *hot) continue ;; esac
      printf 'open loop %s at %s req/s (half of the slower side): p99 tollgate %.2f ms (runs %s us), peer %.2f ms (runs %s us)\n' \
        "$row" "${RATE[$row]}" \
        "$(awk -v v="$(field "$row-open-tollgate" latency_us.p99)" 'BEGIN {print v / 1000}')" "$(runs "$row-open-tollgate" latency_us.p99)" \
        "$(awk -v v="$(field "$row-open-peer" latency_us.p99)" 'BEGIN {print v / 1000}')" "$(runs "$row-open-peer" latency_us.p99)"
    done
    printf 'idle RSS: tollgate %.1f MB, peer %.1f MB\n' "$(awk -v k="$t_idle" 'BEGIN {print k / 1024}')" "$(awk -v k="$p_idle" 'BEGIN {print k / 1024}')"
    if [ -n "$t_fill" ]; then
      printf 'RSS at %s keys: tollgate %.1f MB, peer %.1f MB\n' "$FILL_KEYS" \
        "$(awk -v k="$t_fill" 'BEGIN {print k / 1024}')" "$(awk -v k="$p_fill" 'BEGIN {print k / 1024}')"
    fi
  } | tee -a "$OUT/summary.txt"
  echo "raw results: $OUT"
}

if [ -n "$PEER" ]; then
  peer_main
  exit 0
fi

if [ "$CALLGRIND" = 1 ]; then
  command -v valgrind >/dev/null 2>&1 || { echo "scripts/bench.sh: --callgrind needs valgrind" >&2; exit 1; }
  echo "== instructions per request (callgrind, server process only)"
  callgrind http-ceiling http bench-ceiling http --addr 127.0.0.1:0; C_HTTP=$CG_IR
  callgrind http-tollgate http "${serve_args[@]}" --rules benches/rules/high-limit.yaml; T_HTTP=$CG_IR
  callgrind grpc-ceiling grpc bench-ceiling grpc --addr 127.0.0.1:0; C_GRPC=$CG_IR
  callgrind grpc-tollgate grpc "${serve_args[@]}" --rules benches/rules/high-limit.yaml; T_GRPC=$CG_IR
  {
    echo
    echo "| path | ceiling instr/req | tollgate instr/req | ceiling/tollgate (goal >= 60%) |"
    echo "|---|---:|---:|---:|"
    echo "| HTTP /v1/check | $C_HTTP | $T_HTTP | $(ratio "$C_HTTP" "$T_HTTP") |"
    echo "| gRPC ShouldRateLimit | $C_GRPC | $T_GRPC | $(ratio "$C_GRPC" "$T_GRPC") |"
  } | tee -a "$OUT/summary.txt"
  echo "profiles: callgrind_annotate --inclusive=yes $OUT/callgrind.<name>.1"
  exit 0
fi

echo "== starting the servers (all idle but the one under load)"
start_server ceiling-http bench-ceiling http --addr 127.0.0.1:0
C_HTTP="$SERVER_PID http://$(http_addr)"
start_server ceiling-grpc bench-ceiling grpc --addr 127.0.0.1:0
C_GRPC="$SERVER_PID grpc://$(grpc_addr)"
start_server serve-high "${serve_args[@]}" --rules benches/rules/high-limit.yaml
T_HTTP="$SERVER_PID http://$(http_addr)"; T_GRPC="$SERVER_PID grpc://$(grpc_addr)"; T_PID=$SERVER_PID
sleep 1
IDLE_RSS=$(rss_kb "$T_PID")
start_server serve-tight "${serve_args[@]}" --rules benches/rules/tight-limit.yaml
D_HTTP="$SERVER_PID http://$(http_addr)"; D_GRPC="$SERVER_PID grpc://$(grpc_addr)"

# tollgate serve over Redis (target: Redis store at 64 concurrent requests, p99 < 2 ms on
# loopback), when a Redis answers on 127.0.0.1:6379. Its ceiling is redis-benchmark's EVALSHA
# (`--redis`).
REDIS_SERVICE=0
if ! command -v redis-cli >/dev/null 2>&1 || ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  echo "service over Redis skipped: no Redis answering on 127.0.0.1:6379"
elif ! start_server serve-redis "${serve_args[@]}" --rules benches/rules/high-limit.yaml \
    --store redis://127.0.0.1:6379 2>/dev/null; then
  echo "service over Redis skipped: this tollgate serve does not accept --store redis:// (see $OUT/serve-redis.stderr)"
else
  REDIS_SERVICE=1
  R_HTTP="$SERVER_PID http://$(http_addr)"; R_GRPC="$SERVER_PID grpc://$(grpc_addr)"
fi

echo "== closed loop, $RUNS interleaved rounds"
SCENARIOS=(
  "http-ceiling $C_HTTP"
  "http-tollgate $T_HTTP"
  "http-tollgate-denied $D_HTTP"
  "grpc-ceiling $C_GRPC"
  "grpc-tollgate $T_GRPC"
  "grpc-tollgate-denied $D_GRPC"
)
if [ "$REDIS_SERVICE" = 1 ]; then
  SCENARIOS+=("http-tollgate-redis $R_HTTP" "grpc-tollgate-redis $R_GRPC")
fi
run_rounds
for line in "${SCENARIOS[@]}"; do summarize "${line%% *}"; done

echo "== open loop at half of tollgate's measured maximum (median), $RUNS interleaved rounds"
HTTP_RATE=$(half "$(field http-tollgate throughput_rps)")
GRPC_RATE=$(half "$(field grpc-tollgate throughput_rps)")
# The ceilings at the same rates: what the machine and the stack alone give at that load, so a
# tail that both show is the machine's (see "stalls" and "wakeups" above), not tollgate's. And
# the ceilings at half of *their own* maximum: the same goal applied to the bare stack.
C_HTTP_RATE=$(half "$(field http-ceiling throughput_rps)")
C_GRPC_RATE=$(half "$(field grpc-ceiling throughput_rps)")
SCENARIOS=("http-open $T_HTTP --rate $HTTP_RATE" "http-ceiling-open $C_HTTP --rate $HTTP_RATE"
  "http-ceiling-own-half $C_HTTP --rate $C_HTTP_RATE"
  "grpc-open $T_GRPC --rate $GRPC_RATE" "grpc-ceiling-open $C_GRPC --rate $GRPC_RATE"
  "grpc-ceiling-own-half $C_GRPC --rate $C_GRPC_RATE")
if [ "$REDIS_SERVICE" = 1 ]; then
  R_RATE=$(half "$(field grpc-tollgate-redis throughput_rps)")
  SCENARIOS+=("grpc-redis-open $R_GRPC --rate $R_RATE")
fi
run_rounds
for line in "${SCENARIOS[@]}"; do summarize "${line%% *}"; done
LOADED_RSS=$(rss_kb "$T_PID")
stop_all

if [ "$CORE" = 1 ]; then
  echo "== tollgate-core vs governor (short; BENCHMARKS-HISTORY.md has the full run)"
  cargo bench --locked -p tollgate-core --bench core -- --warm-up-time 1 --measurement-time 2 \
    'single_key/admit/' 2>&1 | grep -E '^(single|keys|threads|step)|time:' | tee "$OUT/core.txt"
  echo "== GCRA vs governor, paired interleaved rounds (the figure for the <= 1.0x target)"
  cargo run --locked --release -q -p tollgate-core --example versus -- 100 20000 | tee "$OUT/versus.txt"
fi
if [ "$REDIS" = 1 ]; then
  echo "== Redis store vs redis-benchmark EVALSHA (BENCHMARKS-HISTORY.md 'Redis store')"
  BENCH_SECS=5 cargo bench --locked -p tollgate-redis --bench redis 2>&1 | tee "$OUT/redis.txt" | tail -n 20
fi

med() { field "$1" throughput_rps; }
eff() { field "$1" req_per_cpu_s; }
row() {
  printf '| %s | %.0f | %.0f | %s | %.0f | %.0f | %s |\n' "$1" "$(med "$2")" "$(med "$3")" \
    "$(ratio "$(med "$3")" "$(med "$2")")" "$(eff "$2")" "$(eff "$3")" "$(ratio "$(eff "$3")" "$(eff "$2")")"
}
{
  echo
  echo "| target (median of $RUNS) | ceiling req/s | tollgate req/s | ratio | ceiling req/CPU-s | tollgate req/CPU-s | ratio (goal >= 60%) |"
  echo "|---|---:|---:|---:|---:|---:|---:|"
  row "HTTP /v1/check, allowed" http-ceiling http-tollgate
  row "HTTP /v1/check, denied" http-ceiling http-tollgate-denied
  row "gRPC ShouldRateLimit, allowed" grpc-ceiling grpc-tollgate
  row "gRPC ShouldRateLimit, denied" grpc-ceiling grpc-tollgate-denied
  echo
  printf 'p99 open loop at half max (goal < 1 ms): HTTP %.0f us at %s req/s (ceiling %.0f us), gRPC %.0f us at %s req/s (ceiling %.0f us)\n' \
    "$(field http-open latency_us.p99)" "$HTTP_RATE" "$(field http-ceiling-open latency_us.p99)" \
    "$(field grpc-open latency_us.p99)" "$GRPC_RATE" "$(field grpc-ceiling-open latency_us.p99)"
  printf 'p99 of the ceilings at half of their own max: HTTP %.0f us at %s req/s, gRPC %.0f us at %s req/s\n' \
    "$(field http-ceiling-own-half latency_us.p99)" "$C_HTTP_RATE" \
    "$(field grpc-ceiling-own-half latency_us.p99)" "$C_GRPC_RATE"
  if [ "$REDIS_SERVICE" = 1 ]; then
    printf 'service over Redis: HTTP %.0f req/s, gRPC %.0f req/s, gRPC p99 %.0f us at %s req/s (goal < 2 ms)\n' \
      "$(med http-tollgate-redis)" "$(med grpc-tollgate-redis)" "$(field grpc-redis-open latency_us.p99)" "$R_RATE"
  fi
  printf 'RSS of tollgate serve: idle %.1f MB (goal < 30 MB), after the runs above %.1f MB\n' \
    "$(awk -v k="$IDLE_RSS" 'BEGIN {print k/1024}')" "$(awk -v k="$LOADED_RSS" 'BEGIN {print k/1024}')"
} | tee -a "$OUT/summary.txt"
echo "raw results: $OUT"
