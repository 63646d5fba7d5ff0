"""Profile one step of the eager executor on a GPU, kernel by kernel (for Nsight Compute).

    python tools/profile_decode_step.py [--model 135m|bundled] [--batch B] [--prompt P]
        [--step decode|prefill]
    ncu --profile-from-start off --launch-count C python tools/profile_decode_step.py ...

Builds the eager executor on the SmolLM2-135M shape (random fp16 weights) or the bundled model,
with ``--batch`` sequences of ``--prompt`` tokens. ``--step prefill`` profiles the step that
prefills them (a 512-token prompt: ``--batch 1 --prompt 512``); ``--step decode`` (the default)
runs the prefill and two decode steps first and profiles the third. Only that step runs between
``cudaProfilerStart`` and ``cudaProfilerStop``, so ``ncu --profile-from-start off`` sees nothing
else, and ``--launch-count C`` keeps its first C kernels (the embedding, then layer 0's ops:
``tools/gpu_session.sh profile``).

Before the step it prints each compiled kernel's registers, local memory (spills) and shared
memory per block — the compiler's view, which costs no profiling time.
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
    for k in kernel.overloads.values():
        if not hasattr(k, "regs_per_thread"):
            continue
        print(f"  {kernel.py_func.__name__:28s} regs {k.regs_per_thread:4d}  "
              f"local {k.local_mem_per_thread:5d} B  shared {k.shared_mem_per_block:6d} B",
              flush=True)


def compiled_kernels():
    """Every op kernel module's compiled kernels (those this run launched have overloads)."""
    from numba.cuda.dispatcher import CUDADispatcher

    from blink_edu.kernels import (attention, elementwise, linear, matmul_tc, matmul_tc_decode,
                                   rope, sampling)
    for module in (linear, matmul_tc, matmul_tc_decode, attention, rope, elementwise, sampling):
        for value in vars(module).values():
            if (isinstance(value, CUDADispatcher) and value.overloads
                    and not value.targetoptions.get("device")):  # kernels, not device functions
                yield value


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="135m")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--step", choices=("decode", "prefill"), default="decode")
    args = parser.parse_args()
    import cupy

    if args.model == "135m":
        weights = random_weights(ModelConfig.from_dict(SMOLLM2_135M), seed=0, scale=0.02)
    else:
        weights = load_weights(resolve_model_dir())
    tokens = args.batch * args.prompt
    block_size = 16
    blocks_a_seq = -(-(args.prompt + 8) // block_size)
    engine = EngineConfig(block_size=block_size, num_kv_blocks=args.batch * blocks_a_seq + 8,
                          max_num_seqs=max(8, args.batch), max_num_batched_tokens=max(64, tokens),
                          max_model_len=max(256, args.prompt + 8))
    executor = EagerExecutor(weights, engine, weight_dtype=np.float16)
    vocab = weights.config.vocab_size
    if args.step == "prefill":  # a first prompt compiles every kernel, a second is profiled
        warm = DecodeRun(executor, args.batch, args.prompt, vocab, np.random.default_rng(1))
        warm.step()
        warm.free()
    run = DecodeRun(executor, args.batch, args.prompt, vocab, np.random.default_rng(0))
    if args.step == "decode":
        for _ in range(3):
            run.step()
    for kernel in compiled_kernels():
        compiled_report(kernel)
    executor.synchronize()
    cupy.cuda.runtime.profilerStart()
    run.step()
    executor.synchronize()
    cupy.cuda.runtime.profilerStop()


if __name__ == "__main__":
    main()
