"""Device-graph dispatch: the scheduler kernel launches each step's forward pass as a CUDA graph,
from the GPU, and waits for it on the GPU.

Blink §3 and §7 (the persistent scheduler "launches the graph executor's captured graphs with
device-side graph launch, fire-and-forget", detects completion by polling, and re-launches itself
as a *tail launch* before the limit of 120 launches per graph execution) and docs/design.md §4 (device
launch from a Numba kernel works: a small CUDA C++ shim, ``cuda.declare_device``, linked with
``libcudadevrt``; ~1.9 µs of GPU time per child graph, ~4.3 µs per tail self-relaunch).

The other dispatcher, *inline* (``persistent_kernel.py``), runs the forward pass inside one
cooperative kernel with a grid barrier between ops. Here the scheduler is a single block and the
forward pass is a graph of one kernel node per op (``forward_ops.forward_op_kernel``):

    host, once     capture the forward graph of each token bucket (two executable copies: a graph
                   cannot be launched again while its previous launch may still be pending),
                   instantiated for device launch; capture the scheduler kernel's launch into a
                   graph too (device launches may only come from a kernel that runs in a graph)
                   and launch that graph. Then the host makes no CUDA call.
    GPU, a step    A read the host's words   B scan, claim, plan (the inline kernel's device
                   functions, on one block)  C write T, R and the step number to ``sizes``,
                   launch the bucket's graph fire-and-forget, spin until its last node writes
                   the step number to ``done``   D publish
    GPU, every     100 steps: launch itself as a tail launch (it runs when this execution and
                   its children are finished; every word of state is in device memory) and end.

Only on a GPU: Numba's simulator cannot link CUDA C++ and has no graphs.
"""

from __future__ import annotations

import numpy as np

from ..backend import get_backend
from ..kernels.reduce import THREADS, cuda
from ..kernels.sync import globaltimer_ns, load_acquire, store_release
from . import persistent_kernel as pk
from .forward_ops import forward_op_kernel, num_ops, op_grid, op_of

MAX_LAUNCHES = 100  # per execution of the scheduler graph (CUDA allows 120 fire-and-forget)

#: CUDA C++ around the device runtime's cudaGraphLaunch (Numba's ABI: the result goes through the
#: first pointer, the return value is Numba's status word).
GRAPH_LAUNCH_SHIM = r"""
#include <cuda_runtime.h>

extern "C" __device__ int launch_graph_fire_and_forget(int* status, unsigned long long graph_exec)
{
    *status = (int)cudaGraphLaunch((cudaGraphExec_t)graph_exec, cudaStreamGraphFireAndForget);
    return 0;
}

extern "C" __device__ int relaunch_this_graph_as_tail(int* status)
{
    *status = (int)cudaGraphLaunch(cudaGetCurrentGraphExec(), cudaStreamGraphTailLaunch);
    return 0;
}
"""


@cuda.jit
def signal_step_done(sizes, done):
    """The forward graph's last node: ``done`` = the step number (the scheduler spins on it)."""
    if cuda.blockIdx.x == 0 and cuda.threadIdx.x == 0:
        store_release(done, 0, sizes[2])


if not get_backend().is_simulator:
    from numba.cuda.cudadrv.libs import get_cudalib

    _LINK = [cuda.CUSource(GRAPH_LAUNCH_SHIM), get_cudalib("cudadevrt", static=True)]
    launch_graph_fire_and_forget = cuda.declare_device(
        "launch_graph_fire_and_forget", "int32(uint64)", link=_LINK)
    relaunch_this_graph_as_tail = cuda.declare_device(
        "relaunch_this_graph_as_tail", "int32()", link=_LINK)

    @cuda.jit(device=True)
    def launch_step_and_wait(sched, sizes, done, graph_execs, bucket_tokens, T, R):
        """Thread 0, C: launch the forward graph of T's bucket and wait for its ``done`` word.
        Returns the launch's cudaError_t (0: the step ran)."""
        step = sched[pk.S_STEPS] + 1
        sizes[0] = T
        sizes[1] = R
        sizes[2] = step
        cuda.threadfence()  # sizes and the flat batch before the graph's first node reads them
        b = 0
        while bucket_tokens[b] < T:
            b += 1
        sched[pk.S_FORWARD_START] = globaltimer_ns()
        status = launch_graph_fire_and_forget(graph_execs[b, step & 1])
        if status != 0:
            return status
        while load_acquire(done, 0) != step:
            pass
        return 0

    @cuda.jit
    def graph_dispatch_scheduler_kernel(ring, control, step, scheduler, row_lane, sizes, done,
                                        graph_execs, bucket_tokens, vocab_size, block_size, budget,
                                        max_model_len, ring_in_device_memory):
        """Phases A, B and D as the inline kernel runs them (the same groups: ``RingArrays``,
        ``StepBuffers``, ``SchedulerState``), C as a graph launch. The forward graphs: ``sizes``
        (T, R, step), ``done`` (1,), ``graph_execs`` (buckets, 2), ``bucket_tokens``
        (buckets,)."""
        tid = cuda.threadIdx.x
        sched = scheduler.sched
        status = cuda.shared.array(1, np.int32)
        launches = 0
        while True:
            pk.read_host_words(ring, control, scheduler)
            cuda.syncthreads()
            if sched[pk.S_DOORBELL_NOW] != sched[pk.S_DOORBELL_SEEN]:
                if tid == 0:
                    sched[pk.S_SCAN_START] = globaltimer_ns()
                pk.scan_ring(ring.state, sched, scheduler.candidates, tid, THREADS)
                cuda.syncthreads()
            pk.schedule_step(ring, control, scheduler, step, row_lane, vocab_size, budget,
                             max_model_len, block_size, ring_in_device_memory)
            cuda.threadfence()  # every thread's part of the flat batch, before the launch
            cuda.syncthreads()
            if sched[pk.S_STOP] != 0:
                return
            T, R = sched[pk.S_TOKENS], sched[pk.S_ROWS]
            if T == 0:
                pk.idle(sched)
                cuda.syncthreads()
                continue
            if tid == 0:
                status[0] = launch_step_and_wait(sched, sizes, done, graph_execs, bucket_tokens,
                                                 T, R)
            else:  # the other threads copy full blocks out meanwhile (DuplexKV)
                pk.copy_mirror(scheduler, tid - 1, THREADS - 1)
            cuda.syncthreads()
            if status[0] != 0:
                if tid == 0:
                    store_release(control, pk.C_DISPATCH_ERROR, status[0])
                return
            pk.publish_step(ring, control, scheduler, step.tokens, row_lane, R, max_model_len)
            launches += 1
            if launches == MAX_LAUNCHES:
                cuda.syncthreads()
                if tid == 0:
                    error = relaunch_this_graph_as_tail()
                    if error != 0:
                        store_release(control, pk.C_DISPATCH_ERROR, error)
                    else:
                        store_release(control, pk.C_RELAUNCHES, control[pk.C_RELAUNCHES] + 1)
                return


# --- host: capture, instantiate for device launch, launch ---------------------------------------
def _check(result):
    """cuda-bindings returns (error, *values): raise on an error, return the values."""
    from cuda.bindings import runtime as cudart

    error, *values = result
    if error != cudart.cudaError_t.cudaSuccess:
        raise RuntimeError(f"CUDA runtime call failed: {error!r}")
    return values[0] if len(values) == 1 else values


def capture_device_graph(stream_ptr: int, record) -> tuple[object, object]:
    """Capture the launches ``record()`` makes on the stream into a graph and instantiate it for
    launch from the device (and the host). Returns (graph, executable graph)."""
    from cuda.bindings import runtime as cudart

    stream = cudart.cudaStream_t(init_value=stream_ptr)
    _check(cudart.cudaStreamBeginCapture(
        stream, cudart.cudaStreamCaptureMode.cudaStreamCaptureModeRelaxed))
    try:
        record()
    finally:
        graph = _check(cudart.cudaStreamEndCapture(stream))
    graph_exec = _check(cudart.cudaGraphInstantiate(
        graph, int(cudart.cudaGraphInstantiateFlags.cudaGraphInstantiateFlagDeviceLaunch)))
    _check(cudart.cudaGraphUpload(graph_exec, stream))
    return graph, graph_exec


def launch_graph(graph_exec, stream_ptr: int) -> None:
    from cuda.bindings import runtime as cudart

    _check(cudart.cudaGraphLaunch(graph_exec, cudart.cudaStream_t(init_value=stream_ptr)))


def destroy_graphs(pairs) -> None:
    from cuda.bindings import runtime as cudart

    for graph, graph_exec in pairs:
        _check(cudart.cudaGraphExecDestroy(graph_exec))
        _check(cudart.cudaGraphDestroy(graph))


def token_buckets(budget: int) -> list[int]:
    """Steps of up to 1, 2, 4, ... tokens, the last one ``budget``: one forward graph each."""
    sizes, n = [], 1
    while n < budget:
        sizes.append(n)
        n *= 2
    return sizes + [budget]


class ForwardGraphs:
    """Per token bucket, two device-launchable graphs of one forward step (one kernel node per op
    of ``forward_ops``, then ``signal_step_done``), over the persistent executor's groups: its
    ``forward_ops.ModelArrays``, ``StepBuffers`` and ``SamplingHistory``. ``execs`` (buckets, 2)
    uint64 and ``bucket_tokens`` (buckets,) go to the kernel."""

    def __init__(self, model, step, history, config, budget: int, max_rows: int,
                 stream_ptr: int):
        self.sizes = cuda.to_device(np.zeros(3, np.int64))  # (T, R, step) of the running step
        self.done = cuda.to_device(np.zeros(1, np.int64))  # the last step the graphs finished
        self.config, self.stream_ptr = config, stream_ptr
        self.args = (model, step, history)  # every node takes the same three groups
        tokens = token_buckets(budget)
        self.record_step(tokens[-1], max_rows)  # compile every kernel outside a capture (T = 0)
        cuda.synchronize()
        self.graphs = [[capture_device_graph(stream_ptr, lambda t=t: self.record_step(
                            t, min(t, max_rows))) for _ in range(2)] for t in tokens]
        self.execs = cuda.to_device(np.array(
            [[int(ex) for _, ex in copies] for copies in self.graphs], np.uint64))  # (buckets, 2)
        self.bucket_tokens = cuda.to_device(np.array(tokens, np.int32))  # (buckets,)

    def record_step(self, max_tokens: int, max_rows: int) -> None:
        """Launch one step's kernels on the stream, grids sized for ``max_tokens`` tokens."""
        cfg, stream = self.config, cuda.external_stream(self.stream_ptr)
        for k in range(num_ops(cfg.num_layers)):
            op, layer = op_of(k, cfg.num_layers)
            grid = op_grid(op, max_tokens, max_rows, cfg, bool(self.args[0].tensor_cores))
            forward_op_kernel[grid, THREADS, stream](op, layer, self.sizes, *self.args)
        signal_step_done[1, 1, stream](self.sizes, self.done)

    def destroy(self) -> None:
        destroy_graphs(pair for copies in self.graphs for pair in copies)
        self.graphs = []
