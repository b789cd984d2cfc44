#!/usr/bin/env bash
# The Postgres rows: tower-lock's Postgres backend beside the locks a Postgres user already
# has, from one run on one cluster: `pg_advisory_xact_lock` in a transaction, a session
# `pg_advisory_lock`, and the simplest correct lease row (INSERT ... ON CONFLICT + DELETE).
#
#   bash benches/postgres.sh       # alone: the Postgres runs and their rows
#   BENCH_PG_FSYNC=off bash benches/postgres.sh   # the test fixture's setting instead
#
# run.sh runs it for its table (BENCH_IN_TABLE=1: no header of its own). Every run uses one
# throwaway cluster this script starts (initdb as the `postgres` user, a free loopback
# port) and stops on exit, with Postgres's default durability (fsync, synchronous_commit
# and full_page_writes on): what a team compares with, and where a lock operation that
# waits for a WAL flush pays for it. Each run has a schema of its own. Figures are the
# median of BENCH_REPEAT runs (3), overtakes the worst run. Reported, never asserted.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
OUT="${OUT:-${CARGO_TARGET_DIR:-target}/bench-results}"
mkdir -p "$OUT"
rm -f "$OUT"/postgres*.json # no figure of an earlier run in this one
REPEAT=${BENCH_REPEAT:-3}
FSYNC=${BENCH_PG_FSYNC:-on}
source benches/table.sh
log() { printf '== %s\n' "$*" >&2; }

PG_BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
if [ -z "$PG_BIN" ] || [ ! -x "$PG_BIN/initdb" ]; then
    log "Postgres is not installed (Debian's postgresql): Postgres figures are n/a"
    row "postgres: not installed" "" "" ""
    exit 0
fi
log "building the contention bench with postgres"
if ! cargo bench --no-run --bench contention --features postgres 2>"$OUT/build-postgres.log"; then
    log "the contention bench does not build with postgres: $OUT/build-postgres.log"
    row "postgres: the bench does not build" "" "" ""
    exit 0
fi

# --- the cluster -----------------------------------------------------------------------
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
PG_DIR=$(mktemp -d)
chown postgres:postgres "$PG_DIR"
chmod 700 "$PG_DIR"
as_pg() { runuser -u postgres -- "$@"; }
stop_pg() {
    as_pg "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$PG_DIR"
}
trap stop_pg EXIT
as_pg "$PG_BIN/initdb" -D "$PG_DIR/data" -U postgres -A trust -E UTF8 --locale=C \
    >"$OUT/postgres-initdb.log" 2>&1
PG_PORT=$(free_port)
as_pg "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/server.log" -w -o \
    "-p $PG_PORT -k $PG_DIR -c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=$FSYNC" \
    start >/dev/null
as_pg "$PG_BIN/psql" -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -q \
    -c "CREATE ROLE tower_lock LOGIN" -c "CREATE DATABASE tower_lock OWNER tower_lock"
DATABASE_URL="postgres://tower_lock@127.0.0.1:$PG_PORT/tower_lock"
PG_VERSION=$("$PG_BIN/postgres" --version | grep -o '[0-9][0-9.]*' | head -1)
log "postgres $PG_VERSION on port $PG_PORT (fsync=$FSYNC, synchronous_commit=on)"

pcontention() { # name args...: a contention run on the cluster, REPEAT times
    local name=$1 i
    shift
    log "contention $name: $*"
    for i in $(seq "$REPEAT"); do
        cargo bench -q --bench contention --features postgres -- --json \
            --database-url "$DATABASE_URL" --label "$name" "$@" \
            >"$OUT/$name.$i.json" 2>"$OUT/$name.log" || { cat "$OUT/$name.log" >&2; return 1; }
    done
}

# --- the runs: each configuration for the engine and every baseline --------------------
UNCONTENDED=(--workers 1 --keys 1 --iterations 3000 --hold-us 0)
CONTENDED=(--workers 8 --keys 1 --iterations 50 --hold-us 1000)
DISTINCT=(--workers 50 --keys 50 --iterations 100 --hold-us 0 --pool 50)
# (name suffix, --backend, extra arguments for the contended run)
LOCKS=("|postgres|--fifo" "-xact|postgres-advisory|" "-session|postgres-advisory-session|")
for lock in "${LOCKS[@]}"; do
    IFS='|' read -r suffix backend extra <<<"$lock"
    pcontention "postgres$suffix-1client" --backend "$backend" "${UNCONTENDED[@]}"
    # shellcheck disable=SC2086 # $extra: no argument, or one
    pcontention "postgres$suffix-8w" --backend "$backend" "${CONTENDED[@]}" $extra
    pcontention "postgres$suffix-50distinct" --backend "$backend" "${DISTINCT[@]}"
done
pcontention postgres-baseline-1client --backend postgres-baseline "${UNCONTENDED[@]}"
pcontention postgres-baseline-50distinct --backend postgres-baseline "${DISTINCT[@]}"
# Released keys leave a fence tombstone each, swept within 10 s (TOMBSTONE_MARGIN plus
# one sweep period): measured right after and 15 s later.
REPEAT=1 pcontention postgres-residue --backend postgres --residue-keys 100000 \
    --workers 50 --pool 50 --ttl-ms 1000 --settle-ms 15000
# Server transactions per contended cycle by engine count (8 workers on one key, worker w
# on engine w mod N, FIFO, 2 connections per engine; goal: within 1.5x of each other),
# measured past the 2 s for which the warm-up's lease keeps every engine listening.
for n in 2 8 32; do
    REPEAT=1 pcontention "postgres-fifo-${n}engines" --backend postgres "${CONTENDED[@]}" \
        --fifo --engines "$n" --pool 2
done
# What bounds that row on Postgres up to 18: the server's own cost of one NOTIFY on a
# channel nobody listens on, beside N idle sessions each listening on a channel of its own.
# Up to Postgres 18 every listening backend of the database is signalled and reads the
# queue in a transaction of its own (from 19, only those listening on the channel), so an
# engine that listens (a waiter queued, a lease held) costs a transaction per hand-off of
# any key. A backend counts those transactions in its statistics when it next runs a
# query or exits: the listeners are ended before the count is read.
notify_fanout() { # listeners: prints server transactions per NOTIFY
    local k=$1 i before after sessions=()
    local psql=(as_pg "$PG_BIN/psql" -h 127.0.0.1 -p "$PG_PORT" -U postgres -qAt -d)
    for i in $(seq "$k"); do
        # A session that listens, then idles until its input ends (closed below).
        exec {fd}> >("${psql[@]}" postgres >/dev/null)
        echo "LISTEN fanout_$i;" >&"$fd"
        sessions+=("$fd")
    done
    # Looked at from template1, so that these looks are not counted.
    until [ "$("${psql[@]}" template1 -c "SELECT count(*) FROM pg_stat_activity
            WHERE query LIKE 'LISTEN fanout_%' AND state = 'idle'")" = "$k" ]; do sleep 0.05; done
    before=$("${psql[@]}" postgres -c "SELECT xact_commit FROM pg_stat_database WHERE datname = 'postgres'")
    for i in $(seq 200); do echo "NOTIFY fanout_nobody;"; done | "${psql[@]}" postgres
    for fd in "${sessions[@]}"; do exec {fd}>&-; done
    until [ "$("${psql[@]}" template1 -c "SELECT count(*) FROM pg_stat_activity
            WHERE query LIKE 'LISTEN fanout_%'")" = 0 ]; do sleep 0.05; done
    after=$("${psql[@]}" postgres -c "SELECT xact_commit FROM pg_stat_database WHERE datname = 'postgres'")
    # The first read's own transaction is the 1 taken off.
    awk -v a="$after" -v b="$before" 'BEGIN { printf "%.2f", (a - b - 1) / 200 }'
}
log "NOTIFY fan-out: 0, 8 and 32 idle listeners"
FANOUT_0=$(notify_fanout 0)
FANOUT_8=$(notify_fanout 8)
FANOUT_32=$(notify_fanout 32)

# benches/pg_fleet.rs: a cycle's latency with a million rows while 32 engines sweep (goal:
# within 1.2x of an empty table) and the sweep's cost against what expired. Bounded: its
# million-row phase has not finished on a loaded 2-core machine (see benches/README.md).
log "pg_fleet: a million rows, 32 engines"
timeout 600 cargo bench -q --bench pg_fleet --features postgres -- --bench --json \
    >"$OUT/pg_fleet.jsonl" 2>"$OUT/pg_fleet.log" ||
    log "pg_fleet failed or ran out of time: $OUT/pg_fleet.log"

# --- the rows --------------------------------------------------------------------------
if [ -z "${BENCH_IN_TABLE:-}" ]; then
    echo
    echo "tower-lock on Postgres  ($(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores," \
        "load average $(cut -d' ' -f1-3 /proc/loadavg), postgres $PG_VERSION, fsync=$FSYNC)"
    echo "contention figures: median of $REPEAT runs each (overtakes: the worst run)"
    printf '%-58s %14s  %-16s %s\n' "figure" "measured" "target" "status"
    printf '%s\n' "$(printf '%.0s-' {1..96})"
fi
echo "postgres: one cluster, fsync=$FSYNC, synchronous_commit=on; xact = pg_advisory_xact_lock" \
    "in BEGIN/COMMIT, session = pg_advisory_lock/unlock"
for n in "" -xact -session -baseline; do
    row "postgres$n uncontended 1 client: cycles/s" "$(F "postgres$n-1client" cycles_per_s)" "" ""
done
row "postgres uncontended / xact" \
    "$(ratio "$(F postgres-1client cycles_per_s)" "$(F postgres-xact-1client cycles_per_s)")" ">=" 0.5
row "postgres uncontended / session" \
    "$(ratio "$(F postgres-1client cycles_per_s)" "$(F postgres-session-1client cycles_per_s)")" "" ""
row "postgres uncontended / simple lock (INSERT ON CONFLICT + DELETE)" \
    "$(ratio "$(F postgres-1client cycles_per_s)" "$(F postgres-baseline-1client cycles_per_s)")" ">=" 0.9
row "postgres uncontended 1 client: wait p50 (us); xact; session" \
    "$(F postgres-1client wait_p50_us); $(F postgres-xact-1client wait_p50_us); $(F postgres-session-1client wait_p50_us)" "" ""
row "postgres uncontended: transactions per cycle; xact; session; simple" \
    "$(F postgres-1client postgres_transactions_per_cycle); $(F postgres-xact-1client postgres_transactions_per_cycle); $(F postgres-session-1client postgres_transactions_per_cycle); $(F postgres-baseline-1client postgres_transactions_per_cycle)" "" ""
for n in "" -xact -session -baseline; do
    row "postgres$n 50 workers, distinct keys: cycles/s" \
        "$(F "postgres$n-50distinct" cycles_per_s)" "" ""
done
row "postgres 50 distinct / xact" \
    "$(ratio "$(F postgres-50distinct cycles_per_s)" "$(F postgres-xact-50distinct cycles_per_s)")" ">=" 0.5
row "postgres 50 distinct / session" \
    "$(ratio "$(F postgres-50distinct cycles_per_s)" "$(F postgres-session-50distinct cycles_per_s)")" "" ""
row "postgres 50 distinct / simple lock at 50 connections" \
    "$(ratio "$(F postgres-50distinct cycles_per_s)" "$(F postgres-baseline-50distinct cycles_per_s)")" ">=" 0.9
for n in "" -xact -session; do
    what="postgres$n 8w/1key/1ms"
    [ -z "$n" ] && what="postgres FIFO 8w/1key/1ms"
    row "$what: hand-off p99 (us)" "$(F "postgres$n-8w" handoff_p99_us)" "" ""
    row "$what: longest wait (ms)" "$(F "postgres$n-8w" longest_wait_ms)" "" ""
    row "$what: overtakes (worst)" "$(Fmax "postgres$n-8w" fifo_overtakes)" "" ""
    row "$what: cycles/s" "$(F "postgres$n-8w" cycles_per_s)" "" ""
    row "$what: transactions per cycle" "$(F "postgres$n-8w" postgres_transactions_per_cycle)" "" ""
done
row "postgres FIFO hand-off p99 / xact" \
    "$(ratio "$(F postgres-8w handoff_p99_us)" "$(F postgres-xact-8w handoff_p99_us)")" "<=" 3
row "postgres FIFO hand-off p99 / session" \
    "$(ratio "$(F postgres-8w handoff_p99_us)" "$(F postgres-session-8w handoff_p99_us)")" "" ""
row "postgres FIFO longest wait / xact" \
    "$(ratio "$(F postgres-8w longest_wait_ms)" "$(F postgres-xact-8w longest_wait_ms)")" "<=" 1.5
row "postgres FIFO longest wait / session" \
    "$(ratio "$(F postgres-8w longest_wait_ms)" "$(F postgres-session-8w longest_wait_ms)")" "" ""
row "postgres FIFO 8w/1key/1ms: FIFO overtakes (worst)" "$(Fmax postgres-8w fifo_overtakes)" "==" 0
if [ -n "$(F redis-fifo handoff_p99_us)" ]; then
    row "postgres FIFO hand-off p99 / redis's" \
        "$(ratio "$(F postgres-8w handoff_p99_us)" "$(F redis-fifo handoff_p99_us)")" "<=" 2
fi
for n in 2 8 32; do
    row "postgres FIFO 8w/1key/1ms over $n engines: transactions per cycle" \
        "$(F "postgres-fifo-${n}engines" postgres_transactions_per_cycle)" "" ""
done
row "postgres hand-off transactions, 8 engines / 2 engines" \
    "$(ratio "$(F postgres-fifo-8engines postgres_transactions_per_cycle)" "$(F postgres-fifo-2engines postgres_transactions_per_cycle)")" "<=" 1.5
row "postgres hand-off transactions, 32 engines / 8 engines" \
    "$(ratio "$(F postgres-fifo-32engines postgres_transactions_per_cycle)" "$(F postgres-fifo-8engines postgres_transactions_per_cycle)")" "<=" 1.5
row "postgres $PG_VERSION itself: transactions per NOTIFY, 0 / 8 / 32 listeners elsewhere" \
    "$FANOUT_0 / $FANOUT_8 / $FANOUT_32" "" ""
if [ -f "$OUT/pg_fleet.jsonl" ]; then
    row "pg_fleet: acquire p50 with a million rows, 32 engines / empty table" \
        "$(grep '"acquire p50' "$OUT/pg_fleet.jsonl" | jget ratio)" "<=" 1.2
fi
row "residue: Postgres lock rows right after 100,000 keys (tombstones)" \
    "$(F postgres-residue postgres_lock_rows_after)" "" ""
row "residue: Postgres live leases; tickets, right after" \
    "$(F postgres-residue postgres_live_leases_after); $(F postgres-residue postgres_tickets_after)" "" ""
psum() { [ -n "$1" ] && [ -n "$2" ] && echo $(($1 + $2)); return 0; }
row "residue: Postgres lock and ticket rows 15 s later" \
    "$(psum "$(F postgres-residue postgres_lock_rows_settled)" "$(F postgres-residue postgres_tickets_settled)")" "==" 0
violations=0
for f in "$OUT"/postgres*.json; do
    [ -f "$f" ] || continue
    v=$(jget mutual_exclusion_violations "$f")
    violations=$((violations + ${v:-0}))
done
row "postgres mutual-exclusion violations, all runs (sum)" "$violations" "==" 0
