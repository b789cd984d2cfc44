#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs what the tests need, then runs them.
# Redis tests start (and stop) their own redis-server processes (one server, a replica, a
# Cluster, Sentinels) on free loopback ports; this script only makes sure the binaries are
# there.
set -euo pipefail
cd "$(dirname "$0")/.."

# redis-server (with redis-cli, and Sentinel as `redis-server --sentinel`) for the Redis
# tests; openssl for the TLS test's certificates; faketime (libfaketime) for the tests
# that step a redis-server's clock; postgresql (initdb, postgres, psql) and pgbouncer for the
# Postgres backend's tests, which make a throwaway cluster as the package's `postgres` user;
# iproute2's `ss`, with which a test sees a statement sent to a stopped backend.
missing=""
command -v redis-server >/dev/null 2>&1 || missing="$missing redis-server"
command -v openssl >/dev/null 2>&1 || missing="$missing openssl"
command -v faketime >/dev/null 2>&1 || missing="$missing faketime"
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$missing postgresql"
command -v psql >/dev/null 2>&1 || missing="$missing postgresql-client"
[ -x /usr/sbin/pgbouncer ] || missing="$missing pgbouncer"
command -v ss >/dev/null 2>&1 || missing="$missing iproute2"
if [ -n "$missing" ]; then
    echo "installing from Debian's packages:$missing" >&2
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi

if [ "$#" -gt 0 ]; then
    # A filter or options of cargo's: cargo runs the binaries, one after another.
    cargo test --workspace --all-features --all-targets "$@"
    cargo test --workspace --all-features --doc
    exit
fi

# Every test target is built once; then the test binaries run two at a time, the slowest
# first. Most of their time is spent waiting on servers, timers and leases, not on a core,
# and each test starts its own servers on free ports, so two binaries side by side share
# nothing. Each binary runs from its package's directory, as under `cargo test`, and its
# output is printed whole once it ends (a failure shows with its binary's name).
built=$(mktemp)
logs=$(mktemp -d)
trap 'rm -rf "$built" "$logs"' EXIT
cargo test --workspace --all-features --all-targets --no-run \
    --message-format=json-render-diagnostics >"$built"

# Seconds each slow binary took in a recent CI run: the order they start in.
weight() {
    case "$(basename "$1" | sed 's/-[0-9a-f]*$//')" in
    postgres) echo 183 ;; redis_faults) echo 129 ;; scale) echo 105 ;; layer) echo 70 ;;
    engine) echo 67 ;; integrations) echo 43 ;; model) echo 33 ;; transactional) echo 25 ;;
    replay) echo 14 ;; tower_lock_engine) echo 9 ;; cli) echo 6 ;;
    *) echo 1 ;;
    esac
}
run_one() {
    local dir=$1 exe=$2 name start rc=0
    name=$(basename "$exe")
    start=$SECONDS
    (cd "$dir" && "$exe") >"$LOGS/$name.log" 2>&1 || rc=$?
    {
        echo "== $name (in $dir): exit $rc after $((SECONDS - start))s"
        cat "$LOGS/$name.log"
    } | flock "$LOGS/.print" cat
    if [ "$rc" != 0 ]; then touch "$LOGS/$name.failed"; fi
    return "$rc"
}
export -f run_one
export LOGS=$logs
sed -n 's/.*"manifest_path":"\([^"]*\)\/Cargo.toml".*"profile":{[^}]*"test":true}.*"executable":"\([^"]*\)".*/\1 \2/p' \
    "$built" | while read -r dir exe; do echo "$(weight "$exe") $dir $exe"; done |
    sort -rn | cut -d' ' -f2- | xargs -P 2 -L 1 bash -c 'run_one "$@"' _ || {
    echo "failed: $(cd "$logs" && ls -- *.failed | sed 's/\.failed$//' | tr '\n' ' ')" >&2
    exit 1
}

cargo test --workspace --all-features --doc
