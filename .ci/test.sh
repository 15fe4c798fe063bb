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
# tmp_path under a base directory of this run alone: pytest's shared /tmp/pytest-of-$USER is
# scanned and pruned by every pytest run on the machine at its end, and what another run
# left there (a busy mount point, a directory another run was deleting) made that cleanup
# fail after every test had passed (warnings are errors here)
BASETEMP=$(mktemp -d "${TMPDIR:-/tmp}/gitxet-tests.XXXXXX")
echo "== pytest"
status=0
python -m pytest -q --basetemp="$BASETEMP" "$@" || status=$?
if [ "$status" -eq 0 ]; then
  rm -rf --one-file-system "$BASETEMP" || echo "could not remove all of $BASETEMP"
else
  echo "the failed run's files are kept in $BASETEMP"
fi
exit "$status"
