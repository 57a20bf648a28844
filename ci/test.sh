#!/usr/bin/env bash
# The README's second command (and CI's): set everything up, lint, check the formatting (the tree
# is ruff-formatted: a change that is not fails here), type-check (mypy, configured in
# pyproject.toml), run the whole test suite. Extra arguments go to pytest, e.g.
# `bash ci/test.sh -m "not emulator and not slow"` for the quick loop.
# --durations=25 lists the slowest tests, so a CI run shows where its time goes (target: under 30 min).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/python -m pytest -q --durations=25 "$@"
