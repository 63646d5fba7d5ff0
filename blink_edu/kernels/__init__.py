"""Numba CUDA kernels for the whole model: one device function per op, three ways to drive it.

docs/design.md §2 ("write each op once"). Every op is a ``@cuda.jit(device=True)`` function that takes
its share of the work: it loops over *work items* (a row, a token, a (token, head) pair...) with
``item = block; item < n_items; item += n_blocks``, and the threads of one CUDA block cooperate
on each item. So the same function serves

* a thin ``@cuda.jit`` kernel, called with ``block = blockIdx.x, n_blocks = gridDim.x`` — one
  launch per op, from Python (the *eager* executor) or captured into a CUDA graph (*graph*);
* the persistent scheduler kernel, which calls the ops one after another between grid barriers.

Kernels know nothing of engines, rings or servers: arrays in, arrays out. Shapes use the letters
of ``model/reference.py``, the oracle every kernel is tested against.

Files: ``reduce`` (block-wide sum/max/argmax), ``linear`` (GEMV and tiled matmul with fused RMSNorm
and residual add), ``elementwise`` (embedding gather, SwiGLU), ``rope`` (rotary embedding + paged KV
write), ``attention`` (paged attention over a ragged flat batch), ``sampling`` (greedy, temperature,
top-k, top-p with the counter-based RNG).
"""
