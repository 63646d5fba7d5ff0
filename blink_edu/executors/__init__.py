"""The executors: what runs one step of the model, and who drives the loop.

docs/design.md §2 (three executors, one model). The host engine (``engine/``) decides *which*
sequences advance; an executor runs the step it is given — or, for the persistent executor, a
kernel on the GPU decides the steps itself (Blink §3). In the order a reader meets them:

* ``protocol``: what an executor is (``Executor``, ``RingExecutor``), and ``step``: the flat
  batch (``StepBatch``) an engine hands a host-driven executor;
* ``reference_executor``: the model in NumPy, the oracle every kernel is checked against;
* ``forward_ops``: the forward pass as a numbered list of ops, written once for every executor;
* ``kernel_executor``: the same ops as Numba CUDA launches, eager or replayed as CUDA graphs;
* ``persistent`` / ``persistent_kernel`` / ``graph_dispatch``: the persistent scheduler kernel.
"""

from .protocol import Executor, RingExecutor

__all__ = ["Executor", "RingExecutor"]
