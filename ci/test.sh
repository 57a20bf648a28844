#!/usr/bin/env bash
# The README's second command (and CI's): set everything up, lint, run the whole test suite.
# Extra arguments go to pytest, e.g. `bash ci/test.sh -m "not emulator and not slow"` for the quick loop.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
.venv/bin/ruff check .
.venv/bin/python -m pytest -q "$@"
