#!/usr/bin/env bash
# Everything the GPU machine is for, in one device call (its time is scarce: 30 min a session).
# Runs the whole test suite on the GPU, then the decode benchmark with its per-op breakdown;
# logs and results land in $OUT. Usage on the device machine:
#   BLINK_EDU_COMMIT=<sha> bash tools/gpu_session.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
timeout 240 bash tools/run_gpu_tests.sh 2>&1 | tee "$OUT/gpu_tests.log" | tail -15
timeout 300 python3 -m blink_edu.bench.decode --out "$OUT" 2>&1 | tee "$OUT/decode.log" | tail -45
