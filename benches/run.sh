#!/usr/bin/env bash
# Runs every benchmark and prints a table of figures against the project's targets.
#
#   bash benches/run.sh            # results (JSON, logs) land in target/bench-results/
#
# Figures are ratios against baselines measured in the same run (redis-benchmark against
# the same server, the bare HTTP server), so they mean something on a busy machine too.
# Targets are reported, never asserted: the script fails only if a bench itself fails.
#
# It starts its own redis-server on a free loopback port (no persistence) and stops it on
# exit; it installs Debian's redis-server (which brings redis-benchmark and redis-cli) if
# missing. The HTTP load generator is built into benches/http/load.rs, so wrk is not needed.
# Budget: well under 10 minutes on 2 cores once the benches are built (Postgres rows: about
# 5 more, on a cluster of their own when postgresql is installed: benches/postgres.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

OUT="${CARGO_TARGET_DIR:-target}/bench-results"
CRITERION_DIR="${CARGO_TARGET_DIR:-target}/criterion"
mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/*.jsonl "$OUT"/*.log

log() { printf '== %s\n' "$*" >&2; }
# The table's helpers (jget, row, F, ratio...).
source benches/table.sh

# --- tools -----------------------------------------------------------------------------
if ! command -v redis-server >/dev/null || ! command -v redis-benchmark >/dev/null; then
    log "redis-server not found; installing it from Debian's packages"
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
fi

log "building the benches"
cargo bench --no-run --bench engine --bench contention --bench http --bench watchdog \
    --bench allocations --bench layer_overhead --bench replay --bench record_memory 2>"$OUT/build.log" ||
    { cat "$OUT/build.log" >&2; exit 1; }

# --- our own Redis ---------------------------------------------------------------------
# A port nobody listens on: connecting to it must fail.
free_port() {
    local p
    for p in $(shuf -i 20000-60000 -n 100); do
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            echo "$p"
            return 0
        fi
    done
    return 1
}

REDIS_PID=""
stop_redis() { if [ -n "$REDIS_PID" ]; then kill "$REDIS_PID" 2>/dev/null || true; wait "$REDIS_PID" 2>/dev/null || true; fi; }
trap stop_redis EXIT

for _ in 1 2 3; do
    PORT=$(free_port)
    redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no \
        --daemonize no --logfile "$OUT/redis.log" &
    REDIS_PID=$!
    for _ in $(seq 50); do
        if redis-cli -p "$PORT" ping 2>/dev/null | grep -q PONG; then break 2; fi
        sleep 0.1
    done
    stop_redis
    REDIS_PID=""
done
if [ -z "$REDIS_PID" ]; then log "could not start redis-server (see $OUT/redis.log)"; exit 1; fi
REDIS_URL="redis://127.0.0.1:$PORT"
export REDIS_URL
log "redis-server $(redis-server --version | grep -o 'v=[0-9.]*') on port $PORT"

# --- baselines: what one Redis does with plain SETs, as a lock cycle is two round trips ---
set_rate() { # clients requests -> SET requests per second
    redis-benchmark -p "$PORT" -t set -c "$1" -n "$2" --csv 2>/dev/null |
        awk -F, '/"SET"/ { gsub(/"/, "", $2); print $2 }'
}
log "redis-benchmark baselines"
SET_C1_FIRST=$(set_rate 1 20000)
SET_C50_FIRST=$(set_rate 50 200000)

# --- contention bench ------------------------------------------------------------------
# Each contention configuration runs REPEAT times (name.1.json, ...); the table shows the
# median of each figure, and the worst run for the must-be-zero counts. A run lasts well
# under a second, so one preemption on a shared machine would otherwise decide its p99.
REPEAT=${BENCH_REPEAT:-3}
contention() { # name args... -> $OUT/name.N.json; returns the bench's status
    local name=$1 i
    shift
    log "contention $name: $*"
    for i in $(seq "$REPEAT"); do
        cargo bench -q --bench contention -- --json --label "$name" "$@" \
            >"$OUT/$name.$i.json" 2>"$OUT/$name.log" || return
    done
}
once() { # name args...: a contention run that is not repeated
    REPEAT=1 contention "$@"
}

CONTENDED=(--workers 8 --keys 1 --iterations 50 --hold-us 1000)
contention memory-fifo --backend memory "${CONTENDED[@]}" --fifo
contention memory-nofifo --backend memory "${CONTENDED[@]}"
contention memory-1client --backend memory --workers 1 --keys 1 --iterations 200000 --hold-us 0
contention memory-50distinct --backend memory --workers 50 --keys 50 --iterations 4000 --hold-us 0
once memory-residue --backend memory --residue-keys 1000000

REDIS_BACKEND=yes
if ! contention redis-fifo --backend redis "${CONTENDED[@]}" --fifo; then
    if grep -q "redis backend not built" "$OUT/redis-fifo.log"; then
        rm -f "$OUT"/redis-fifo.*.json
        REDIS_BACKEND=no
        log "the Redis backend is not in this build: Redis figures are n/a"
    else
        cat "$OUT/redis-fifo.log" >&2
        exit 1
    fi
fi
if [ "$REDIS_BACKEND" = yes ]; then
    contention redis-nofifo --backend redis "${CONTENDED[@]}"
    # Two engines (two pools, two subscribers) on one Redis: FIFO across the nodes of a fleet.
    contention redis-fifo-2engines --backend redis "${CONTENDED[@]}" --fifo --engines 2
    # One engine per worker (8 nodes of a fleet), not FIFO: the wait must stay bounded, with
    # a busy critical section (spin) and one that yields its thread (sleep).
    contention redis-nofifo-8engines-spin --backend redis "${CONTENDED[@]}" --engines 8 --hold spin
    contention redis-nofifo-8engines-sleep --backend redis "${CONTENDED[@]}" --engines 8 --hold sleep
    contention redis-1client --backend redis --workers 1 --keys 1 --iterations 5000 --hold-us 0
    # The simplest correct Redis lock (SET NX PX + compare-and-delete script), same client.
    contention redis-baseline-1client --backend redis-baseline --workers 1 --keys 1 \
        --iterations 5000 --hold-us 0
    contention redis-50distinct --backend redis --workers 50 --keys 50 --iterations 400 --hold-us 0
    # Its own database, so DBSIZE counts exactly what it leaves; a short TTL, so the keys
    # Redis keeps on purpose for a while (with a TTL) are gone when it looks again.
    once redis-residue --backend redis --redis-url "$REDIS_URL/1" --workers 16 \
        --residue-keys 100000 --ttl-ms 1000 --settle-ms 15000
fi

# --- a local Redis Cluster (3 primaries, 3 replicas), same contention runs --------------
# The contention bench built with the `redis-cluster` feature (a build of its own; the
# runs above use the default features). Baseline: redis-benchmark --cluster SET -c 50.
CLUSTER_DIR=$(mktemp -d)
CLUSTER_PIDS=()
stop_cluster() {
    local p
    for p in "${CLUSTER_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${CLUSTER_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$CLUSTER_DIR"
}
trap 'stop_cluster; stop_redis' EXIT
CLUSTER_NODES=()
if [ "$REDIS_BACKEND" = yes ]; then
    log "building the contention bench with redis-cluster"
    cargo bench --no-run --bench contention --features redis-cluster 2>"$OUT/build-cluster.log" ||
        { cat "$OUT/build-cluster.log" >&2; exit 1; }
    # A node also listens on its port + 10000 (the cluster bus): both must be free.
    free_cluster_port() {
        local p
        for p in $(shuf -i 20000-55000 -n 200); do
            if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null &&
                ! (exec 3<>"/dev/tcp/127.0.0.1/$((p + 10000))") 2>/dev/null; then
                echo "$p"
                return 0
            fi
        done
        return 1
    }
    for i in 1 2 3 4 5 6; do
        p=$(free_cluster_port)
        mkdir -p "$CLUSTER_DIR/$i"
        redis-server --port "$p" --bind 127.0.0.1 --save "" --appendonly no --daemonize no \
            --cluster-enabled yes --dir "$CLUSTER_DIR/$i" --logfile "$(realpath "$OUT")/cluster-$i.log" &
        CLUSTER_PIDS+=($!)
        CLUSTER_NODES+=("127.0.0.1:$p")
        up=no
        for _ in $(seq 50); do
            if redis-cli -p "$p" ping 2>/dev/null | grep -q PONG; then up=yes; break; fi
            sleep 0.1
        done
        # (The log path is absolute: the server opens it after changing to its --dir.)
        if [ $up = no ]; then log "cluster node $i did not start: $OUT/cluster-$i.log"; exit 1; fi
    done
    redis-cli --cluster create "${CLUSTER_NODES[@]}" --cluster-replicas 1 --cluster-yes \
        >"$OUT/cluster-create.log" 2>&1 ||
        { log "redis-cli --cluster create failed: $OUT/cluster-create.log"; exit 1; }
    for _ in $(seq 100); do
        if redis-cli --cluster check "${CLUSTER_NODES[0]}" 2>/dev/null |
            grep -q "All 16384 slots covered"; then break; fi
        sleep 0.1
    done
    CLUSTER_PORT=${CLUSTER_NODES[0]#*:}
    CLUSTER_URLS=$(printf 'redis://%s,' "${CLUSTER_NODES[@]}")
    CLUSTER_URLS=${CLUSTER_URLS%,}
    log "redis cluster on ${CLUSTER_NODES[*]}"
    cluster_set_rate() {
        redis-benchmark --cluster -p "$CLUSTER_PORT" -t set -c 50 -n 200000 --csv 2>/dev/null |
            awk -F, '/"SET"/ { gsub(/"/, "", $2); print $2 }'
    }
    CLUSTER_SET_C50_FIRST=$(cluster_set_rate)
    ccontention() { # name args...: a contention run on the cluster
        local name=$1 i
        shift
        log "contention $name: $*"
        for i in $(seq "$REPEAT"); do
            cargo bench -q --bench contention --features redis-cluster -- --json \
                --label "$name" --backend redis-cluster --redis-url "$CLUSTER_URLS" "$@" \
                >"$OUT/$name.$i.json" 2>"$OUT/$name.log" || return
        done
    }
    ccontention cluster-fifo "${CONTENDED[@]}" --fifo
    ccontention cluster-50distinct --workers 50 --keys 50 --iterations 400 --hold-us 0
    CLUSTER_SET_C50_LAST=$(cluster_set_rate)
fi

# The baselines again, after the Redis runs: the higher of the two counts, so a moment of
# competing load during one measurement cannot make the ratios look better than they are.
log "redis-benchmark baselines, again"
SET_C1_LAST=$(set_rate 1 20000)
SET_C50_LAST=$(set_rate 50 200000)
SET_C1=$(max "$SET_C1_FIRST" "$SET_C1_LAST")
SET_C50=$(max "$SET_C50_FIRST" "$SET_C50_LAST")
printf '{"set_c1_rps":[%s,%s],"set_c50_rps":[%s,%s]}\n' "$SET_C1_FIRST" "$SET_C1_LAST" \
    "$SET_C50_FIRST" "$SET_C50_LAST" >"$OUT/redis-benchmark.json"

# --- HTTP bench (its Redis scenarios say "skipped" while the backend is not built) ------
log "http bench"
cargo bench -q --bench http -- --json --duration-secs 6 --rounds 3 --redis-url "$REDIS_URL" \
    >"$OUT/http.jsonl" 2>"$OUT/http.log"

# --- watchdog: CPU per live lease, against the backend's own renew cost ----------------
log "watchdog bench"
cargo bench -q --bench watchdog -- --leases 20000 --ttl-ms 3000 --window-s 6 \
    >"$OUT/watchdog.json" 2>"$OUT/watchdog.log"

# --- idempotency replay: replayed requests/s, the first request's fingerprinting cost ---
log "replay bench"
cargo bench -q --bench replay -- --json --duration-secs 4 --redis-url "$REDIS_URL" \
    >"$OUT/replay.jsonl" 2>"$OUT/replay.log"

# --- allocations per locked request (a counting global allocator) -----------------------
log "allocations bench"
cargo bench -q --bench allocations -- >"$OUT/allocations.json" 2>"$OUT/allocations.log"

# --- the lock layer at the tower level, in process, beside tower_governor's keyed rate check --
log "layer overhead bench"
cargo bench -q --bench layer_overhead -- >"$OUT/layer_overhead.jsonl" 2>"$OUT/layer_overhead.log"

# --- what an in-process record really costs (RSS), against what the budget charges --------
log "record memory bench"
cargo bench -q --bench record_memory -- >"$OUT/record_memory.json" 2>"$OUT/record_memory.log"

# --- criterion micro-benches -------------------------------------------------------------
log "criterion micro-benches"
rm -rf "$CRITERION_DIR/engine" "$CRITERION_DIR/layer" # no stale figures in the table
cargo bench -q --bench engine -- --warm-up-time 1 --measurement-time 2 \
    >"$OUT/engine.log" 2>&1

# --- the table (its helpers: benches/table.sh) -------------------------------------------
http_get() { grep "\"name\":\"$1\"" "$OUT/http.jsonl" | jget "$2"; }
crit_ns() { # group/bench -> mean in ns
    local f="$CRITERION_DIR/${1%%/*}/$(echo "${1#*/}" | tr '/' '_')/new/estimates.json"
    [ -f "$f" ] && grep -o '"point_estimate":[0-9.e+-]*' "$f" | head -1 | cut -d: -f2
}
echo
echo "tower-lock benchmarks  ($(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores," \
    "load average $(cut -d' ' -f1-3 /proc/loadavg), redis on :$PORT)"
echo "contention figures: median of $REPEAT runs each (overtakes, longest run: the worst run)"
echo "baselines: redis-benchmark SET -c 1: $SET_C1/s (runs: $SET_C1_FIRST, $SET_C1_LAST)," \
    "-c 50: $SET_C50/s (runs: $SET_C50_FIRST, $SET_C50_LAST); a lock cycle = 2 round trips"
printf '%-58s %14s  %-16s %s\n' "figure" "measured" "target" "status"
printf '%s\n' "$(printf '%.0s-' {1..96})"
for b in redis memory; do
    handoff_target=400
    [ $b = memory ] && handoff_target=50
    row "$b FIFO 8w/1key/1ms: hand-off p99 (us)" "$(F $b-fifo handoff_p99_us)" "<=" $handoff_target
    row "$b FIFO 8w/1key/1ms: longest wait (ms)" "$(F $b-fifo longest_wait_ms)" "<=" 12
    row "$b FIFO 8w/1key/1ms: FIFO overtakes" "$(Fmax $b-fifo fifo_overtakes)" "==" 0
    row "$b FIFO 8w/1key/1ms: cycles/s" "$(F $b-fifo cycles_per_s)" ">=" 800
    if [ $b = redis ]; then
        row "$b FIFO 8w/1key/1ms: Redis commands per cycle" \
            "$(F $b-fifo redis_commands_per_cycle)" "<=" 13
    fi
    row "$b FIFO 8w/1key/1ms: longest run by one worker (worst)" "$(Fmax $b-fifo longest_run)" "" ""
    row "$b FIFO / non-FIFO throughput" \
        "$(ratio "$(F $b-fifo cycles_per_s)" "$(F $b-nofifo cycles_per_s)")" ">=" 0.9
    row "$b non-FIFO 8w/1key/1ms: hand-off p99 (us)" "$(F $b-nofifo handoff_p99_us)" "" ""
    row "$b non-FIFO 8w/1key/1ms: FIFO overtakes" "$(F $b-nofifo fifo_overtakes)" "" ""
done
HALF_C1=$(calc "${SET_C1:-0} / 2" 0)
HALF_C50=$(calc "${SET_C50:-0} / 2" 0)
row "redis FIFO across 2 engines: FIFO overtakes" "$(Fmax redis-fifo-2engines fifo_overtakes)" "==" 0
row "redis FIFO across 2 engines: hand-off p99 (us)" "$(F redis-fifo-2engines handoff_p99_us)" "" ""
for h in spin sleep; do
    r=redis-nofifo-8engines-$h
    row "redis non-FIFO 8 engines ($h): longest wait (ms)" "$(Fmax $r longest_wait_ms)" "<=" 50
    row "redis non-FIFO 8 engines ($h): hand-off p99 (us)" "$(F $r handoff_p99_us)" "<=" 400
    row "redis non-FIFO 8 engines ($h): Redis commands per cycle" \
        "$(F $r redis_commands_per_cycle)" "<=" 14
    row "redis non-FIFO 8 engines ($h): longest run by one worker" "$(Fmax $r longest_run)" "" ""
done
row "redis baseline lock (SET NX PX + CAD) 1 client: cycles/s" \
    "$(F redis-baseline-1client cycles_per_s)" "" ""
row "redis uncontended 1 client / baseline lock" \
    "$(ratio "$(F redis-1client cycles_per_s)" "$(F redis-baseline-1client cycles_per_s)")" ">=" 0.95
row "redis uncontended 1 client: Redis commands per cycle" \
    "$(F redis-1client redis_commands_per_cycle)" "<=" 7
row "redis uncontended 1 client: cycles/s" "$(F redis-1client cycles_per_s)" ">=" \
    "$(calc "0.9 * $HALF_C1" 0)"
row "redis   ... as a fraction of SET -c 1 / 2" \
    "$(ratio "$(F redis-1client cycles_per_s)" "$HALF_C1")" ">=" 0.9
row "redis 50 workers, distinct keys: cycles/s" "$(F redis-50distinct cycles_per_s)" ">=" \
    "$(calc "0.9 * $HALF_C50" 0)"
row "redis   ... as a fraction of SET -c 50 / 2" \
    "$(ratio "$(F redis-50distinct cycles_per_s)" "$HALF_C50")" ">=" 0.9
row "redis 50 workers, distinct keys: Redis commands per cycle" \
    "$(F redis-50distinct redis_commands_per_cycle)" "<=" 7
CLUSTER_SET_C50=$(max "${CLUSTER_SET_C50_FIRST:-}" "${CLUSTER_SET_C50_LAST:-}")
row "cluster 50 workers, distinct keys: cycles/s" "$(F cluster-50distinct cycles_per_s)" "" ""
row "cluster   ... as a fraction of SET --cluster -c 50 / 2" \
    "$(ratio "$(F cluster-50distinct cycles_per_s)" "$(calc "${CLUSTER_SET_C50:-0} / 2" 0)")" \
    ">=" 0.8
row "cluster FIFO 8w/1key/1ms: hand-off p99 (us)" "$(F cluster-fifo handoff_p99_us)" "" ""
row "cluster FIFO hand-off p99 / standalone" \
    "$(ratio "$(F cluster-fifo handoff_p99_us)" "$(F redis-fifo handoff_p99_us)")" "<=" 1.2
row "cluster FIFO 8w/1key/1ms: cycles/s / standalone" \
    "$(ratio "$(F cluster-fifo cycles_per_s)" "$(F redis-fifo cycles_per_s)")" "" ""
row "cluster FIFO 8w/1key/1ms: FIFO overtakes" "$(Fmax cluster-fifo fifo_overtakes)" "==" 0
row "memory uncontended 1 client: cycles/s" "$(F memory-1client cycles_per_s)" "" ""
row "memory 50 workers, distinct keys: cycles/s" "$(F memory-50distinct cycles_per_s)" "" ""

row "http bare: requests/s" "$(http_get bare rps)" "" ""
for s in lock_layer/memory/distinct lock_layer/memory/hot lock_in_handler/memory/distinct \
    lock_in_handler/memory/hot lock_layer/redis/distinct lock_layer/redis/hot \
    lock_in_handler/redis/distinct lock_in_handler/redis/hot; do
    if [ "$s" = lock_layer/memory/distinct ]; then
        row "http $s / bare" "$(http_get "$s" ratio_to_bare)" ">=" 0.95
    else
        row "http $s / bare" "$(http_get "$s" ratio_to_bare)" "" ""
    fi
done
row "http lock_layer/memory/distinct: p99 latency (us)" "$(http_get lock_layer/memory/distinct p99_us)" "" ""
row "http bare: p99 latency (us)" "$(http_get bare p99_us)" "" ""

replay_get() { grep "\"scenario\":\"$1\"" "$OUT/replay.jsonl" | jget "$2"; }
row "replay in process: replayed requests/s / bare axum" "$(replay_get replay/memory ratio_to_bare)" ">=" 0.8
row "replay on redis: replayed requests/s" "$(replay_get replay/redis rps)" "" ""
row "replay on redis / redis-benchmark GET -c 50" "$(replay_get replay/redis ratio_to_get)" ">=" 0.5
row "replay on redis: round trips, first request (begin + complete)" \
    "$(replay_get round_trips/redis first_request_round_trips)" "<=" 2
row "replay on redis: round trips, replay" "$(replay_get round_trips/redis replay_round_trips)" "<=" 1
row "replay: first request, 1 KiB body: overhead (us)" "$(replay_get first_request/1KiB overhead_us)" "" ""
row "replay: first request, 1 MiB body: overhead (us)" "$(replay_get first_request/1MiB overhead_us)" "" ""
row "in-process records: RSS grown per record (bytes)" \
    "$(jget rss_grown_per_record "$OUT/record_memory.json")" "" ""
row "in-process records: budget charged per record (bytes)" \
    "$(jget charged_per_record "$OUT/record_memory.json")" "" ""
row "in-process records: RSS grown / budget charged" \
    "$(jget ratio "$OUT/record_memory.json")" "<=" 1.5
row "allocations per request: bare axum" "$(jget bare_per_request "$OUT/allocations.json")" "" ""
row "allocations per request: + LockLayer (memory), extra" \
    "$(jget lock_layer_memory_extra_per_request "$OUT/allocations.json")" "" ""
lo_get() { grep "\"workload\":\"$1\"" "$OUT/layer_overhead.jsonl" | jget "$2"; }
for w in hot distinct; do
    row "tower LockLayer (memory), $w key: ns/request over bare" \
        "$(lo_get $w lock_layer_extra_ns)" "<=" 400
    row "tower_governor, $w key: ns/request over bare" "$(lo_get $w governor_extra_ns)" "" ""
    row "tower LockLayer / tower_governor ($w key), extra ns" \
        "$(lo_get $w lock_layer_extra_per_governor_extra)" "" ""
    row "tower LockLayer ($w key): allocations/request over bare" \
        "$(lo_get $w lock_layer_extra_allocations)" "" ""
done
row "allocations per cycle: engine memory" "$(jget engine_memory_per_cycle "$OUT/allocations.json")" "" ""
row "allocations per cycle: engine redis" "$(jget engine_redis_per_cycle "$OUT/allocations.json")" "<=" 20
row "watchdog: CPU % of a core, 20,000 live leases (3 s TTL)" "$(jget cpu_pct "$OUT/watchdog.json")" "" ""
row "watchdog: CPU ms per s per 1,000 live leases" "$(jget cpu_ms_per_s_per_1000 "$OUT/watchdog.json")" "" ""
row "watchdog: CPU / the backend's own renew work" "$(jget overhead "$OUT/watchdog.json")" "" ""
row "residue: memory keys left after 1,000,000 locked+released" "$(F memory-residue key_count_after)" "==" 0
row "residue: RSS before (KiB)" "$(F memory-residue rss_before_kib)" "" ""
row "residue: RSS after (KiB)" "$(F memory-residue rss_after_kib)" "" ""
row "residue: Redis keys right after 100,000 locks (TTL'd keys)" "$(F redis-residue redis_dbsize_after)" "" ""
row "residue: Redis keys 15 s later (lease TTL 1 s)" "$(F redis-residue redis_dbsize_settled)" "==" 0

# --- Postgres (benches/postgres.sh): its runs on a cluster of its own, beside the
# advisory locks and the simple lease row; it prints its own rows.
log "postgres runs"
BENCH_IN_TABLE=1 OUT="$OUT" BENCH_REPEAT="$REPEAT" bash benches/postgres.sh ||
    log "the postgres runs failed (see $OUT/postgres*.log)"

violations=0
for f in "$OUT"/*.json; do
    v=$(jget mutual_exclusion_violations "$f")
    violations=$((violations + ${v:-0}))
done
row "mutual-exclusion violations, all contention runs (sum)" "$violations" "==" 0

for c in engine/memory/acquire_release engine/memory/acquire_release_fifo \
    engine/memory/acquire_release_fresh_key engine/memory/try_acquire_busy \
    engine/redis/acquire_release engine/redis/acquire_release_fifo layer/bare \
    layer/lock_in_handler/memory layer/lock_layer/memory; do
    ns=$(crit_ns "$c" || true)
    row "criterion $c (ns)" "${ns:+$(calc "$ns" 0)}" "" ""
done
# --- permits (benches/permits.rs): N = 4 with 16 workers, readers beside a writer, each
# against the single lock in the same run; in process, and on our Redis. Self-contained:
# it builds, runs and prints its own rows.
PERMITS_URL=()
[ "$REDIS_BACKEND" = yes ] && PERMITS_URL=(--redis-url "$REDIS_URL")
log "permits bench"
if cargo bench -q --bench permits -- "${PERMITS_URL[@]}" >"$OUT/permits.jsonl" 2>"$OUT/permits.log"; then
    permits_get() { grep "\"backend\":\"$1\"" "$OUT/permits.jsonl" | jget "$2"; }
    for b in memory redis; do
        row "$b permits N=4 16w/1ms: hand-off p99 (us)" "$(permits_get $b permits_handoff_p99_us)" "" ""
        row "$b permits hand-off p99 / the lock's" "$(permits_get $b handoff_p99_ratio)" "<=" 1.5
        row "$b permits N=4 16w/1ms: cycles/s" "$(permits_get $b permits_cycles_per_s)" "" ""
        row "$b permits cycles/s / the lock's" "$(permits_get $b cycles_ratio)" ">=" 3
        row "$b readers/s beside a writer" "$(permits_get $b readers_per_s)" "" ""
        row "$b readers/s beside a writer / the lock's cycles/s" \
            "$(permits_get $b readers_ratio_to_lock)" "" ""
        row "$b permits: exclusion violations" "$(permits_get $b violations)" "==" 0
    done
else
    log "the permits bench failed: $OUT/permits.log"
fi
# Exactly once for database writes (benches/transactional.rs: its own Postgres): an insert through the layer ÷ the same insert in its own transaction, 16 clients.
if cargo bench -q --features postgres --bench transactional -- --json >"$OUT/transactional.jsonl" 2>"$OUT/transactional.log"; then row "transactional insert, 16 clients: layer / own transaction" "$(jget ratio "$OUT/transactional.jsonl")" ">=" 0.7; row "transactional replay, 16 clients: requests/s" "$(grep replay "$OUT/transactional.jsonl" | jget rps)" "" ""; else log "the transactional bench failed: $OUT/transactional.log"; fi
echo
echo "raw results: $OUT/ (a JSON object per contention run, JSON lines for http)"
