"""Profile one decode step of the eager executor on a GPU, kernel by kernel (for Nsight Compute).

    python tools/profile_decode_step.py [--model 135m|bundled] [--steps N]
    ncu --clock-control none --launch-skip K --launch-count C \
        python tools/profile_decode_step.py

A step of the eager executor launches ``forward_ops.num_ops(L)`` kernels (213 for 135M), and the
prefill and the first decode step come before the timed steps: ``--launch-skip 427
--launch-count 7`` profiles one layer of the second decode step (``tools/gpu_session.sh profile``).

Builds the eager executor on the SmolLM2-135M shape (random fp16 weights) or the bundled model,
prefills a 16-token prompt and runs ``--steps`` batch-1 decode steps. Before the steps it prints
each compiled kernel's registers, local memory (spills) and shared memory per block, and whether
its PTX holds 16-byte loads — the compiler's view, which costs no profiling time.
"""
from __future__ import annotations

import argparse

import numpy as np

from blink_edu.bench.decode import SMOLLM2_135M, DecodeRun
from blink_edu.config import EngineConfig, ModelConfig
from blink_edu.executors.kernel_executor import EagerExecutor
from blink_edu.model.bundled import resolve_model_dir
from blink_edu.model.weights import load_weights, random_weights


def compiled_report(kernel) -> None:
    for sig, k in kernel.overloads.items():
        ptx = kernel.inspect_asm(sig)
        print(f"  {kernel.py_func.__name__:28s} regs {k.regs_per_thread:4d}  "
              f"local {k.local_mem_per_thread:5d} B  shared {k.shared_mem_per_block:6d} B  "
              f"ld.v4 {ptx.count('ld.global.v4') + ptx.count('ld.v4')}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="135m")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    if args.model == "135m":
        weights = random_weights(ModelConfig.from_dict(SMOLLM2_135M), seed=0, scale=0.02)
    else:
        weights = load_weights(resolve_model_dir())
    engine = EngineConfig(block_size=16, num_kv_blocks=64, max_num_seqs=8,
                          max_num_batched_tokens=64, max_model_len=256)
    executor = EagerExecutor(weights, engine, weight_dtype=np.float16)
    run = DecodeRun(executor, 1, 16, weights.config.vocab_size, np.random.default_rng(0))
    run.step()
    run.step()
    from blink_edu.kernels import attention, elementwise, linear, rope, sampling
    for kernel in (linear.gemv_kernel, attention.paged_attention_kernel,
                   rope.rope_and_write_kv_kernel, elementwise.swiglu_kernel,
                   sampling.sample_rows_kernel):
        compiled_report(kernel)
    for _ in range(args.steps):
        run.step()


if __name__ == "__main__":
    main()
