#!/usr/bin/env bash
# The README's second command (and CI's): set everything up, lint, check the formatting (the tree
# is ruff-formatted: a change that is not fails here), type-check (mypy, configured in
# pyproject.toml), run the whole test suite. Extra arguments go to pytest, e.g.
# `bash ci/test.sh -m "not emulator and not slow"` for the quick loop.
# --durations=25 lists the slowest tests, so a CI run shows where its time goes (target: under 30 min).
# Most tests keep one core busy (a compile, an emulator run), so pytest runs one worker process per
# CPU this job may use (pytest-xdist; nproc counts a cpuset, as deploy's host_cpus does), each test
# file whole in one worker (--dist loadfile: what a file's tests share, an emulator session or the
# matrix's bundles, is built once), the longest files first (tests/conftest.py: LONGEST_FILES;
# xdist's own reorder is by number of tests). `-n 0` as an extra argument runs them in this process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/python -m pytest -q -n "$(nproc)" --dist loadfile --no-loadscope-reorder --durations=25 "$@"
