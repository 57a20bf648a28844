#!/usr/bin/env bash
# Tune every shipped op on x86 at a shape that fits the last-level cache and one well past it,
# then report default vs hand vs tuned (medians of interleaved runs on this host).
#   bash bench/tune_sweep.sh [DB]        (TRIALS=64 by default; the same command again continues)
set -euo pipefail
DB=${1:-tuning-sweep}
TRIALS=${TRIALS:-64}
export TVM_NUM_THREADS=${TVM_NUM_THREADS:-$(nproc)}
tune() { deploy tune --target x86 --trials "$TRIALS" --db "$DB" "$@"; }
for n in 8 16; do
  size=$([ "$n" = 8 ] && echo 56 || echo 112)
  tune --op add --shape "${n}x64x${size}x${size}" --shape "${n}x64x${size}x${size}"
  tune --op leaky_relu --shape "${n}x64x${size}x${size}"
done
for shape in 4x64x56x56 16x64x112x112; do
  tune --op max_pool2d --shape "$shape" -a kernel=3 -a stride=2 -a padding=1
  tune --op max_pool2d --shape "$shape"   # the op's default window: 2x2, stride 2
done
tune --op max_pool2d --shape 1x64x112x112 -a kernel=3 -a stride=2 -a padding=1
tune --op argmax --shape 256x4096
tune --op argmax --shape 4096x4096
deploy tune --report --target x86 --db "$DB"
