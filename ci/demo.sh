#!/usr/bin/env bash
# The README's first command: set everything up, then verify every op cross-compiled for ARM on the emulator,
# and an ONNX model with a custom op (fused into one kernel) against numpy and onnxruntime, its batch symbolic
# (one module run at N = 1, 3 and 32); then the same model with its pooling packed by 4 channels (--layout).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
.venv/bin/deploy test --target arm
.venv/bin/deploy --ops-path deploy/ops/examples test --model examples/pool_add_leaky_htanh_n.onnx --target arm
.venv/bin/deploy --ops-path deploy/ops/examples test --model examples/pool_add_leaky_htanh_n.onnx --target arm --layout NCHW4c
