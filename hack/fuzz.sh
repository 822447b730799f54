#!/usr/bin/env bash
# `make fuzz`: the verify engine, longer than `make test` runs it.
#   - the PostgreSQL oracle (haltsql/tests/engine_oracle.rs) with
#     FUZZ_QUERIES SQLsmith queries (default 20000) and seed FUZZ_SEED;
#   - the engine's property tests (parser + engine on arbitrary bytes, SQL
#     noise and generated queries; panics fail) with FUZZ_CASES cases each
#     (default 20000).
# cargo-fuzz is not used (it needs nightly compiler features and a libFuzzer
# build, not set up here); the property tests are the bounded stand-in.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
started=0
if [[ "$(hack/postgres.sh status)" != *running* ]]; then started=1; fi
cleanup() {
  local status=$?
  if [ "$started" = 1 ]; then hack/postgres.sh down >/dev/null 2>&1 || true; fi
  exit $status
}
trap cleanup EXIT
HALTSQL_ORACLE_PGHOST="$(hack/postgres.sh up)"
export HALTSQL_ORACLE_PGHOST
HALTSQL_ORACLE_SQLSMITH_QUERIES="${FUZZ_QUERIES:-20000}" HALTSQL_ORACLE_SEED="${FUZZ_SEED:-$RANDOM}" \
  cargo test --release -p haltsql --test engine_oracle -- --nocapture
HALTSQL_FUZZ_CASES="${FUZZ_CASES:-20000}" cargo test --release -p haltsql --test engine_proptest
