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
# Postgres backend's tests, which make a throwaway cluster as the package's `postgres` user.
missing=""
command -v redis-server >/dev/null 2>&1 || missing="$missing redis-server"
command -v openssl >/dev/null 2>&1 || missing="$missing openssl"
command -v faketime >/dev/null 2>&1 || missing="$missing faketime"
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$missing postgresql"
command -v psql >/dev/null 2>&1 || missing="$missing postgresql-client"
[ -x /usr/sbin/pgbouncer ] || missing="$missing pgbouncer"
if [ -n "$missing" ]; then
    echo "installing from Debian's packages:$missing" >&2
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi

cargo test --workspace --all-features --all-targets "$@"
cargo test --workspace --all-features --doc
