#!/usr/bin/env bash
# The whole test suite, as the README says: deps, lint, types, layering, tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/deps.sh
VENV=${GITXET_VENV:-.venv}
export PATH="$PWD/$VENV/bin:$PATH"
export GITXET_REQUIRE_NATIVE=1
echo "== ruff"; ruff check gitxet tests bench; ruff format --check gitxet tests bench
echo "== mypy"; mypy
echo "== import-linter"; lint-imports
echo "== pytest"; python -m pytest -q "$@"
