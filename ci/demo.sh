#!/usr/bin/env bash
# The README's first command: set everything up, then verify every op cross-compiled for ARM on the emulator.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
.venv/bin/deploy test --target arm
