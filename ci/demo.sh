#!/usr/bin/env bash
# The README's first command: set everything up, then verify every op on the default target.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
.venv/bin/deploy test --target x86
