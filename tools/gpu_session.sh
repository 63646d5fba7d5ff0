#!/usr/bin/env bash
# Everything the GPU machine is for, in one device call (its time is scarce: 30 min a session,
# 10 min a call). Runs the GPU-relevant tests, then every GPU benchmark with a bounded time each;
# logs and results land in $OUT (results via BLINK_EDU_RESULTS_DIR). Usage on the device machine:
#   BLINK_EDU_COMMIT=<sha> bash tools/gpu_session.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" OUT="${OUT:-/tmp/out}"
export BLINK_EDU_RESULTS_DIR="$OUT"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
timeout 150 bash tools/run_gpu_tests.sh tests/kernels tests/engine tests/kv tests/sched \
  2>&1 | grep -v Warn | tee "$OUT/gpu_tests.log" | tail -8
timeout 150 python3 -m blink_edu.bench.persistent --hog-seconds 20 2>&1 | tee "$OUT/persistent.log" | tail -16
timeout 80 python3 -m blink_edu.bench.kv_transfer --budget-s 55 2>&1 | tee "$OUT/kv_transfer.log" | tail -16
timeout 200 python3 -m blink_edu.bench.decode --out "$OUT" --hf-compile-timeout 30 2>&1 \
  | grep -v "Warn\|warn\|cudagraph" | tee "$OUT/decode.log" | tail -30
