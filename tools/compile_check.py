"""Compile the op kernels for an H100/H200 (sm_90) on a machine with no GPU: PTX through libnvvm,
then ptxas for each kernel's registers, spills and shared memory. It catches what the simulator
cannot (invalid IR from an intrinsic, a type the GPU compiler refuses, register spills) at no
device time.

    python tools/compile_check.py [--out DIR]   # needs the CUDA toolkit's libnvvm and ptxas

Numba asks the driver for the device's compute capability and the supported targets; with no
driver they are answered here (sm_90), which is the only patching this script does.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import types as pytypes
from pathlib import Path

os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
import numpy as np  # noqa: E402

if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack
from numba import cuda, types  # noqa: E402
from numba.np import numpy_support  # noqa: E402

import blink_edu.backend as backend  # noqa: E402

backend._backend = backend.Backend(name="gpu", cuda=cuda, xp=np, device_name="none (PTX only)")
import numba.cuda.cudadrv.libs as libs  # noqa: E402
import numba.cuda.cudadrv.nvrtc as nvrtc  # noqa: E402
import numba.cuda.cudadrv.nvvm as nvvm  # noqa: E402
import numba.cuda.dispatcher as dispatcher  # noqa: E402

dispatcher.get_current_device = lambda: pytypes.SimpleNamespace(compute_capability=(9, 0))
nvrtc.get_supported_ccs = lambda: ((7, 5), (8, 0), (8, 6), (8, 9), (9, 0))
LIBDEVICE = sorted(glob.glob("/usr/local/cuda*/nvvm/libdevice/libdevice.10.bc"))[-1]
libs.get_libdevice = lambda: LIBDEVICE
nvvm.get_libdevice = libs.get_libdevice


def arr(dtype, ndim):
    return types.Array(dtype, ndim, "C")


F32, F64, I32, F16 = types.float32, types.float64, types.int32, types.float16


def kernels():
    """(name, kernel, signature) of every op kernel, as the executors launch them."""
    from blink_edu.kernels import (attention, elementwise, linear, matmul_tc, matmul_tc_decode,
                                   rope, sampling)
    from blink_edu.kv import device_blocks
    from blink_edu.sched import device_policy
    lin = lambda w: (arr(F32, 2), arr(I32, 1), arr(F32, 1), F32, arr(w, 2), arr(F32, 1),  # noqa: E731
                     arr(F32, 2), types.int64)
    tile_args = (arr(F32, 2), arr(I32, 1), arr(F32, 1), F32, arr(F16, 2), arr(F32, 1),
                 arr(F32, 1), arr(F32, 2), types.int64, types.int64)
    attention_args = (arr(F32, 2), arr(I32, 1), arr(I32, 1), arr(I32, 2), arr(F32, 6), types.int64,
                      types.int64, types.int64, arr(F32, 2), arr(F32, 2), arr(I32, 1))
    return [
        ("linear_fp16", linear.linear_kernel, lin(F16) + (types.boolean,)),
        ("gemv_fp16", linear.gemv_kernel, lin(F16)),
        ("tiled_matmul_fp16", linear.tiled_matmul_kernel, lin(F16)),
        ("tc_prologue", matmul_tc.tc_prologue_kernel,
         (arr(F32, 2), arr(I32, 1), arr(F32, 1), F32, arr(F32, 1), arr(F32, 2), types.int64,
          types.boolean, arr(F32, 1))),
        ("tc_matmul", matmul_tc.tc_matmul_kernel.builds[True], tile_args),
        ("tc_matmul_unaligned", matmul_tc.tc_matmul_kernel.builds[False], tile_args),
        ("tc_swiglu", matmul_tc.tc_swiglu_kernel.builds[True], lin(F16)[:-1]),
        ("tc_qkv_rope", matmul_tc.tc_qkv_rope_kernel.builds[True],
         lin(F16)[:-1] + (arr(I32, 1), arr(I32, 1), arr(I32, 2), arr(F32, 2), arr(F32, 2),
                          arr(F32, 6), types.int64, types.int64, types.int64)),
        ("tc_decode_linear", matmul_tc_decode.tc_decode_linear_kernel.builds[True], lin(F16)),
        ("tc_decode_swiglu", matmul_tc_decode.tc_decode_swiglu_kernel.builds[True], lin(F16)[:-1]),
        ("tc_decode_qkv_rope", matmul_tc_decode.tc_decode_qkv_rope_kernel.builds[True],
         lin(F16)[:-1] + (arr(I32, 1), arr(I32, 1), arr(I32, 2), arr(F32, 2), arr(F32, 2),
                          arr(F32, 6), types.int64, types.int64, types.int64)),
        ("linear_fp32", linear.linear_kernel, lin(F32) + (types.boolean,)),
        ("gemv_swiglu_fp16", linear.gemv_swiglu_kernel, lin(F16)[:-1]),
        ("gemv_qkv_rope_fp16", linear.gemv_qkv_rope_kernel,
         lin(F16)[:-1] + (arr(I32, 1), arr(I32, 1), arr(I32, 2), arr(F32, 2), arr(F32, 2),
                          arr(F32, 6), types.int64, types.int64, types.int64)),
        ("paged_attention", attention.paged_attention_kernel, attention_args),
        ("paged_attention_tc", attention.paged_attention_tc_kernel, attention_args),
        ("rope_and_write_kv", rope.rope_and_write_kv_kernel,
         (arr(F32, 2), arr(I32, 1), arr(I32, 1), arr(I32, 2), arr(F32, 2), arr(F32, 2),
          arr(F32, 6), types.int64, types.int64, types.int64)),
        ("swiglu", elementwise.swiglu_kernel, (arr(F32, 2), arr(F32, 2))),
        ("sample_rows", sampling.sample_rows_kernel,
         (arr(F32, 2), arr(F32, 1), arr(F32, 1), arr(I32, 1), arr(types.uint32, 1),
          arr(I32, 1), arr(I32, 1))),
        ("books (kv)", device_blocks.books_kernel,
         (types.int64,) * 3 + (arr(I32, 1), arr(I32, 2), arr(I32, 1)) + (arr(I32, 2),) * 3
         + (arr(I32, 1), types.int64) + (arr(I32, 1),) * 3),
        ("claim (kv)", device_blocks.claim_kernel, (arr(I32, 1), arr(I32, 1))),
        ("decide (sched)", device_policy.decide_kernel,
         (types.int64, arr(I32, 1)) + (arr(F64, 1),) * 3 + (arr(I32, 1),) * 3
         + (F64, types.int64, types.int64) + (F64,) * 5 + (types.int64, arr(F64, 1))
         + (arr(I32, 1),) * 4),
    ]


# Run in a simulator process: the persistent executor's kernel arguments, as (dtype, ndim) of each
# array or the type name of each scalar, for the micro model with fp16 weights.
ARGUMENTS_OF_THE_PERSISTENT_KERNELS = """
import json, numpy as np
from blink_edu.config import EngineConfig
from blink_edu.executors.persistent import PersistentExecutor
from blink_edu.model.micro import micro_weights
from blink_edu.ring import Ring, RingLayout
layout = RingLayout(num_slots=8, max_prompt_tokens=16, max_output_tokens=8)
executor = PersistentExecutor(micro_weights(seed=3, num_attention_heads=4, num_key_value_heads=2),
                              EngineConfig(block_size=4, num_kv_blocks=12, max_num_seqs=2,
                                           max_num_batched_tokens=8),
                              Ring(bytearray(layout.nbytes), layout), weight_dtype=np.float16)
forward = (executor.model, executor.step_buffers, executor._sampling_history())
def describe(a):
    if isinstance(a, tuple):  # a named group (forward_ops.ModelArrays, ...): its class, its fields
        return ["group", [type(a).__name__, [describe(x) for x in a]]]
    a = getattr(a, "_ary", a)  # the simulator's device-array wrapper
    if isinstance(a, np.ndarray):
        return [str(a.dtype), a.ndim]
    return [type(a).__name__, None]
print(json.dumps({"persistent": [describe(a) for a in executor._args()],
                  "forward_op": [["int", None], ["int", None], ["int64", 1]]
                                + [describe(a) for a in forward]}))
"""


def persistent_kernel_types() -> dict[str, tuple]:
    """The argument types of the two persistent kernels, from a simulator-built executor."""
    env = {**os.environ, "BLINK_EDU_BACKEND": "sim", "NUMBA_ENABLE_CUDASIM": "1"}
    done = subprocess.run([sys.executable, "-c", ARGUMENTS_OF_THE_PERSISTENT_KERNELS], env=env,
                          capture_output=True, text=True, check=True)
    scalars = {"int": types.int64, "float32": types.float32, "float": types.float64,
               "bool": types.boolean}

    from blink_edu.executors import forward_ops, persistent_kernel
    groups = {cls.__name__: cls for cls in (forward_ops.ModelArrays, forward_ops.StepBuffers,
                                            forward_ops.SamplingHistory,
                                            persistent_kernel.RingArrays,
                                            persistent_kernel.SchedulerState)}

    def numba_type(dtype, ndim):
        if dtype == "group":
            name, fields = ndim
            return types.NamedTuple([numba_type(*d) for d in fields], groups[name])
        return scalars[dtype] if ndim is None else arr(numpy_support.from_dtype(np.dtype(dtype)), ndim)

    described = json.loads(done.stdout.strip().splitlines()[-1])
    return {name: tuple(numba_type(*d) for d in args) for name, args in described.items()}


def persistent_kernels():
    from blink_edu.executors import forward_ops, persistent_kernel
    sigs = persistent_kernel_types()
    return [("persistent_inline", persistent_kernel.persistent_scheduler_kernel,
             sigs["persistent"]),
            ("forward_op (graph)", forward_ops.forward_op_kernel, sigs["forward_op"])]


def ptxas(path: Path) -> subprocess.CompletedProcess:
    """ptxas's report on one kernel; relocatable (``-c``) for a kernel whose grid sync needs the
    device runtime at link time (its figures then differ a little from a linked build's)."""
    run = lambda *flags: subprocess.run(["ptxas", "-arch=sm_90", "-v", *flags, str(path),  # noqa: E731
                                         "-o", os.devnull], capture_output=True, text=True)
    report = run()
    if "Unresolved extern" in report.stderr:
        report = run("-c")
        report.stderr += "\n(relocatable)"
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="/tmp/blink_edu_ptx", help="folder for the .ptx files")
    parser.add_argument("--only", default="", help="only the kernels whose name contains this")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name, func, sig in kernels() + persistent_kernels():
        if args.only not in name:
            continue
        try:
            ptx, _ = cuda.compile_ptx(func.py_func, sig, cc=(9, 0),  # with the kernel's bounds
                                      launch_bounds=func.targetoptions.get("launch_bounds"))
        except Exception as err:  # noqa: BLE001 - reported, then the next kernel
            print(f"{name:20s} FAILED to compile: {type(err).__name__}: {str(err)[:int(os.environ.get('ERRLEN', '300'))]}")
            failed += 1
            continue
        path = out / f"{name}.ptx"
        path.write_text(ptx)
        report = ptxas(path)
        regs = re.findall(r"Used (\d+) registers", report.stderr)
        spills = re.findall(r"(\d+) bytes spill stores", report.stderr)
        smem = re.findall(r"(\d+) bytes smem", report.stderr)
        print(f"{name:20s} regs {','.join(regs) or '?':>7s}  spill stores {','.join(spills) or '0':>5s} B"
              f"  smem {','.join(smem) or '0':>6s} B  ld.global.v4 {ptx.count('ld.global.v4'):3d}"
              f"  mma {ptx.count('mma.sync'):3d}" + ("" if report.returncode == 0 else "  ptxas FAILED")
              + ("  (relocatable)" if "(relocatable)" in report.stderr else ""))
        failed += report.returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
