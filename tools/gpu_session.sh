#!/usr/bin/env bash
# Everything the GPU machine is for, in four device calls (its time is scarce: 30 min a session,
# 10 min a call), each bounded: "tests" runs the GPU-relevant tests; "kernels" the persistent and
# KV transfer benchmarks; "decode" the decode benchmark beside its peers; "serving" the server's
# load test and the real-engine SLO run.
# Logs and results land in $OUT (results via BLINK_EDU_RESULTS_DIR). On the device machine, with
# the commit written out (the device's copy of the tree may carry a stale .git: never ask git there):
#   bash tools/gpu_session.sh tests
#   BLINK_EDU_COMMIT=<sha> bash tools/gpu_session.sh kernels
#   BLINK_EDU_COMMIT=<sha> bash tools/gpu_session.sh decode
#   BLINK_EDU_COMMIT=<sha> bash tools/gpu_session.sh serving
#   bash tools/gpu_session.sh profile    # Nsight Compute on layer 0 of a b1 step, a b64 step, a prefill
#   BLINK_EDU_COMMIT=<sha> bash tools/gpu_session.sh attention  # the prompt attention tile, compared
#   BLINK_EDU_COMMIT=<sha> bash tools/gpu_session.sh tile       # the tensor-core tile: variants, stalls
#   BLINK_EDU_COMMIT=<sha> bash tools/gpu_session.sh quick      # TPOT b1 / b64 and prefill, graph only
#   BLINK_EDU_COMMIT=<sha> bash tools/gpu_session.sh rotasched  # RotaSched on the persistent kernel, CPU hog
# The server's packages (fastapi, starlette, uvicorn, pydantic and their needs) are not on the GPU
# machine: fetch them here as cp312 wheels into .whl/ (git-ignored) and carry .whl with the call:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_17_x86_64 -d .whl fastapi starlette uvicorn \
#     pydantic pydantic_core annotated-types typing-inspection typing_extensions opentelemetry-api
set -uo pipefail
cd "$(dirname "$0")/.."
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" OUT="${OUT:-/tmp/out}"
export BLINK_EDU_RESULTS_DIR="$OUT"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
case "${1:-kernels}" in
tests)  # a call of its own: the GPU-relevant tests. Most of their time is Numba compiling kernels (the
        # persistent kernel with every op in it), one core each: with pytest-xdist (on the GPU machine)
        # 12 worker processes share the GPU — 370 s at 94ea9cf, where one process ran past 570 s
workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n 12")
timeout 570 bash tools/run_gpu_tests.sh tests/kernels tests/executors tests/engine tests/kv tests/sched \
  $workers -rfEs 2>&1 | grep -v -i warn | tee "$OUT/gpu_tests.log" | tail -8
;;
kernels)
timeout 240 python3 -m blink_edu.bench.persistent --hog-seconds 20 2>&1 | tee "$OUT/persistent.log" | tail -16
timeout 80 python3 -m blink_edu.bench.kv_transfer --budget-s 55 2>&1 | tee "$OUT/kv_transfer.log" | tail -16
;;
decode)  # a call of its own (run it with the call's full 600 s): both models, six batches, the peers' compiles
         # (warmed in parallel since f2829c2, when three batches compiled one after another ran past 588 s;
         # six batches not yet timed). decode.json is rewritten after every stage: a cut run keeps what it measured
timeout 588 python3 -m blink_edu.bench.decode --out "$OUT" --hf-compile-timeout 30 --peer-timeout 200 \
  2>&1 | grep -v "Warn\|warn\|cudagraph" | tee "$OUT/decode.log" | tail -30
;;
serving)
timeout 150 python3 -m blink_edu.bench.serve --start-server --single-stream \
  --request-rates 25,50,100,200,inf --num-prompts 300 2>&1 | grep -v -i warn | tail -12
cp bench/results/slo.json "$OUT/slo.json"  # --real merges into the simulator's results
timeout 420 python3 -m blink_edu.bench.slo --real --executor graph --rates auto --num-requests 200 \
  --policies fcfs,lvf,waiting-first,swapped-first --out "$OUT" --no-progress 2>&1 | tail -12
;;
rotasched)  # both papers in one kernel: bench.slo --real on the graph executor and the persistent kernel
           # (inline dispatch), the same plan and workload, LVF again beside a CPU hog (a call of its own)
cp bench/results/slo.json "$OUT/slo.json"  # --real merges into the simulator's results
timeout 570 python3 -m blink_edu.bench.slo --real --executor graph,${EXECUTORS:-persistent} --hog \
  --rates auto --num-requests 200 --policies fcfs,lvf --out "$OUT" --no-progress 2>&1 \
  | grep -v "^  sim: \|[Ww]arn" | tee "$OUT/slo_rotasched.log" | tail -30
;;
attention)  # the prompt attention tile: chunk sizes 16 / 32 / 64 against the per-token path; decode
            # batches on the per-token path, split over spans of 64 / 128 positions or not; then Nsight
            # Compute on both kernels at one 512-token prompt
timeout 240 python3 tools/attention_probe.py --chunks 16 32 64 --json "$OUT/attention_probe.json" \
  2>&1 | grep -v -i warn | tee "$OUT/attention_probe.log" | tail -12
timeout 120 python3 tools/attention_probe.py --decode --json "$OUT/attention_probe_decode.json" \
  2>&1 | grep -v -i warn | tee "$OUT/attention_probe_decode.log" | tail -14
timeout 200 ncu --clock-control none -k regex:paged_attention --section LaunchStats --section Occupancy \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section SourceCounters \
  python3 tools/attention_probe.py --once --tokens 512 > "$OUT/ncu_attention.txt" 2>&1
grep -E "paged_attention|Duration|Registers Per|Achieved Occ|Warp Cycles Per Issued|Grid Size" "$OUT/ncu_attention.txt" | head -30
;;
profile)  # Nsight Compute on the first kernels (the embedding, then layer 0) of three steps of the
          # 135M shape: a batch-1 decode step, a batch-64 decode step, one 512-token prefill
NCU="ncu --clock-control none --profile-from-start off --section LaunchStats --section Occupancy
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats
  --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis
  --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
for run in "b1 --batch 1 --prompt 128" "b64 --batch 64 --prompt 128" "prefill512 --batch 1 --prompt 512 --step prefill"; do
  set -- $run; name=$1; shift
  timeout 180 $NCU --launch-count 12 python3 tools/profile_decode_step.py "$@" > "$OUT/ncu_$name.txt" 2>&1
  echo "== $name"; grep -E "^  [a-z_]+.*regs|^  [a-zA-Z_]+.*\(|Duration|Registers Per|Achieved Occ|Warp Cycles Per Issued|DRAM Throughput|Compute \(SM\) Th|hmma" "$OUT/ncu_$name.txt" \
    | grep -v "^  *[a-z_]* *regs" | sed 's/  */ /g' | head -90
done
;;
tile)  # the tensor-core tile alone at the 135M shapes (checked against the reference, then timed),
       # gate/up with SwiGLU in its epilogue beside the tile then swiglu_kernel and matmul_tc_decode;
       # then Nsight Compute's stall reasons on the 512-token gate/up (the probe's third shape)
timeout 150 python3 tools/tc_matmul_probe.py --rows 64 128 512 --steps --gemv-max 0 \
  --json "$OUT/tile.json" 2>&1 | grep -v -i warn | tail -24
NCU="ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats
  --section WarpStateStats --section SchedulerStats
  --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
timeout 120 $NCU -k regex:tc_matmul_kernel --launch-skip 2 --launch-count 1 \
  python3 tools/tc_matmul_probe.py --once --rows 512 > "$OUT/ncu_tile_r512.txt" 2>&1
grep -E "Duration|Registers Per|Achieved Occ|Warp Cycles Per Issued|stalled" "$OUT/ncu_tile_r512.txt" \
  | sort -k3 -g -r | head -12
;;
quick)  # after a kernel change: the 135M shape's TPOT at batch 1 and 64 and its 512-token prefill,
        # the graph executor only (the eager one's launch-bound steps took most of a 170-s run)
timeout 200 python3 -m blink_edu.bench.decode --batches 1,64 --steps 16 --models 135m --skip-hf \
  --peers '' --executors graph --out "$OUT" 2>&1 | grep -E '"(tpot_us_135m_b|prefill_ms_135m)'
;;
*) echo "usage: $0 tests|kernels|decode|serving|rotasched|attention|profile|tile|quick" >&2; exit 2 ;;
esac
