"""Sampling on the GPU: greedy, temperature, top-k and top-p, reproducing the NumPy reference.

``model/sampling.py`` defines the draw; this is the same definition done by one CUDA block per
sequence, with reductions instead of a sort:

* greedy: a block-wide argmax (ties to the lowest id);
* the top-k threshold ``t_k`` (k-th largest scaled logit) and the top-p threshold ``t_p`` are
  found by **bisection**: keep ``lo`` with "enough kept" and ``hi`` with "not enough", halve the
  interval (in float64) until ``lo`` and ``hi`` are adjacent doubles — then ``lo`` *is* the
  threshold value exactly, because the kept count/mass only changes at the data's values;
* the draw: each thread sums the kept probabilities of its own contiguous slice of the
  vocabulary, an exclusive prefix sum over threads says where each slice starts, and the thread
  whose slice holds ``u * mass`` walks it to the token (inverse CDF in id order).

Logit adjustments (``logit_bias``, presence and frequency penalties) come before, in their own
small kernel, ``adjust_logits_kernel``: the host sends each row's ``(token, delta)`` pairs (each
token once, so no two threads touch one logit) and the kernel adds them in place. A step without
any is not launched at all. A kernel with no host to build those lists -- Blink's persistent
scheduler kernel, which reads requests straight from the ring -- adjusts a row from the request's
own record instead (``adjust_row_from_history``: its generated tokens and its logit_bias), with
the same float64 arithmetic as the reference, so the tokens stay identical.

``u`` comes from the same counter-based hash (``lowbias32``) as the reference, computed with
64-bit integers and masks so that it is bit-identical on every backend.
"""

from __future__ import annotations

import math

from numba import float32, float64, int32, uint64

from .reduce import NEG_INF, THREADS, block_argmax, block_max, block_sum, cuda

MASK32 = uint64(0xFFFFFFFF)
MAX_BISECTIONS = 200  # float64 halving from the logit range to adjacent doubles takes ~70


@cuda.jit(device=True, inline=True)
def lowbias32(x):
    x = uint64(x) & MASK32
    x ^= x >> uint64(16)
    x = (x * uint64(0x7FEB352D)) & MASK32
    x ^= x >> uint64(15)
    x = (x * uint64(0x846CA68B)) & MASK32
    x ^= x >> uint64(16)
    return x


@cuda.jit(device=True, inline=True)
def uniform(seed, counter):
    """The reference's ``uniform(seed, counter)``: 24 random bits as a float32 in [0, 1)."""
    h = lowbias32(lowbias32(seed) ^ ((uint64(counter) * uint64(0x9E3779B9)) & MASK32))
    return float32(h >> uint64(8)) / float32(16777216.0)


@cuda.jit(device=True, inline=True)
def scaled(logits, s, i, mx, temp):
    """z = (logit - max) / temperature, in float32 like the reference."""
    return (logits[s, i] - mx) / temp


@cuda.jit(device=True, inline=True)
def kept_count(logits, s, mx, temp, tau, scratch):
    n = float32(0)
    for i in range(cuda.threadIdx.x, logits.shape[1], THREADS):
        if float64(scaled(logits, s, i, mx, temp)) >= tau:
            n += 1
    return block_sum(n, scratch)


@cuda.jit(device=True, inline=True)
def kept_mass(logits, s, mx, temp, tau, floor, scratch):
    """sum(exp(z) for z >= max(tau, floor))."""
    total = float32(0)
    for i in range(cuda.threadIdx.x, logits.shape[1], THREADS):
        z = scaled(logits, s, i, mx, temp)
        if float64(z) >= tau and float64(z) >= floor:
            total += math.exp(z)
    return block_sum(total, scratch)


@cuda.jit(device=True, inline=True)
def top_k_threshold(logits, s, mx, temp, k, lowest, scratch):
    """The k-th largest z: the largest tau with count(z >= tau) >= k."""
    lo, hi = lowest, float64(1)
    for _ in range(MAX_BISECTIONS):
        mid = lo + (hi - lo) * 0.5
        if mid <= lo or mid >= hi:
            break
        if kept_count(logits, s, mx, temp, mid, scratch) >= k:
            lo = mid
        else:
            hi = mid
    return lo


@cuda.jit(device=True, inline=True)
def top_p_threshold(logits, s, mx, temp, p, floor, lowest, scratch):
    """The largest tau whose kept mass (above ``floor``) reaches p of the mass above ``floor``."""
    target = p * kept_mass(logits, s, mx, temp, lowest, floor, scratch)
    lo, hi = lowest, float64(1)
    for _ in range(MAX_BISECTIONS):
        mid = lo + (hi - lo) * 0.5
        if mid <= lo or mid >= hi:
            break
        if kept_mass(logits, s, mx, temp, mid, floor, scratch) >= target:
            lo = mid
        else:
            hi = mid
    return lo


@cuda.jit(device=True)
def sample_rows(logits, temperature, top_p, top_k, seeds, counters, out_tokens, block, n_blocks):
    """out_tokens[s] = the sampled token of row s. logits (S, V) f32; per-row params (S,)."""
    tid = cuda.threadIdx.x
    V = logits.shape[1]
    scratch = cuda.shared.array(THREADS, float32)
    indices = cuda.shared.array(THREADS, int32)
    choice = cuda.shared.array(1, int32)
    for s in range(block, logits.shape[0], n_blocks):
        best, best_i = NEG_INF, int32(0)
        for i in range(tid, V, THREADS):  # ascending i and strict '>' keep the lowest id
            if logits[s, i] > best:
                best, best_i = logits[s, i], int32(i)
        mx, argmax = block_argmax(best, best_i, scratch, indices)
        temp = temperature[s]
        if temp == 0:
            if tid == 0:
                out_tokens[s] = argmax
            continue  # uniform across the block: no thread skips a barrier the others reach
        smallest = float32(0)
        for i in range(tid, V, THREADS):
            smallest = min(smallest, scaled(logits, s, i, mx, temp))
        lowest = float64(-block_max(-smallest, scratch))
        floor = lowest
        if 0 < top_k[s] < V:
            floor = top_k_threshold(logits, s, mx, temp, top_k[s], lowest, scratch)
        if top_p[s] < 1:
            floor = max(floor, top_p_threshold(logits, s, mx, temp, top_p[s], floor, lowest, scratch))
        # Inverse CDF in id order: thread tid owns ids [begin, end).
        span = (V + THREADS - 1) // THREADS
        begin, end = tid * span, min(V, tid * span + span)
        part, last_kept = float32(0), int32(-1)
        for i in range(begin, end):
            z = scaled(logits, s, i, mx, temp)
            if float64(z) >= floor:
                part += math.exp(z)
                last_kept = int32(i)
        mass = block_sum(part, scratch)
        target = uniform(seeds[s], counters[s]) * mass
        last_kept_all = int32(block_max(float32(last_kept), scratch))
        scratch[tid] = part
        if tid == 0:
            choice[0] = -1
        cuda.syncthreads()
        if tid == 0:  # exclusive prefix sum of the slices' masses (THREADS values: serial is fine)
            running = float32(0)
            for j in range(THREADS):
                here = scratch[j]
                scratch[j] = running
                running += here
        cuda.syncthreads()
        run = scratch[tid]
        if run <= target < run + part:
            for i in range(begin, end):
                z = scaled(logits, s, i, mx, temp)
                if float64(z) >= floor:
                    run += math.exp(z)
                    if run > target:
                        choice[0] = i  # at most one thread's slice holds the target
                        break
        cuda.syncthreads()
        if tid == 0:
            out_tokens[s] = choice[0] if choice[0] >= 0 else last_kept_all
        cuda.syncthreads()


@cuda.jit
def sample_rows_kernel(logits, temperature, top_p, top_k, seeds, counters, out_tokens):
    sample_rows(logits, temperature, top_p, top_k, seeds, counters, out_tokens,
                cuda.blockIdx.x, cuda.gridDim.x)


@cuda.jit(device=True)
def adjust_rows(logits, adjust_ids, adjust_deltas, adjust_len, block, n_blocks):
    """logits[s, adjust_ids[s, j]] += adjust_deltas[s, j] for j < adjust_len[s], in place.
    logits (S, V) f32; adjust_ids (S, P) i32 (distinct per row); adjust_deltas (S, P) f32."""
    for s in range(block, logits.shape[0], n_blocks):
        for j in range(cuda.threadIdx.x, adjust_len[s], THREADS):
            logits[s, adjust_ids[s, j]] += adjust_deltas[s, j]


@cuda.jit
def adjust_logits_kernel(logits, adjust_ids, adjust_deltas, adjust_len):
    adjust_rows(logits, adjust_ids, adjust_deltas, adjust_len, cuda.blockIdx.x, cuda.gridDim.x)


@cuda.jit(device=True)
def adjust_row_from_history(logits, s, history, n, presence, frequency, bias_ids, bias_values):
    """Row ``s`` of ``logits`` (S, V) f32, adjusted in place from the request's record: its
    ``n`` generated tokens ``history`` (O,) i32 and its ``bias_ids`` / ``bias_values`` (B,)
    (-1 padded). One thread per distinct token: the one holding its first occurrence in
    ``history`` (or, for a biased token never generated, the one holding its bias entry) adds
    ``float32(bias - frequency * count - presence)``, computed in float64 as the reference
    does. O(n^2 / THREADS) per row: meant for the few rows that ask for penalties. All threads
    of the block call it; it ends with a barrier."""
    tid = cuda.threadIdx.x
    penalised = presence != 0 or frequency != 0
    for j in range(tid, n if penalised else 0, THREADS):
        t = history[j]
        first, count = True, 0
        for k in range(n):
            if history[k] == t:
                count += 1
                if k < j:
                    first = False
        if first:
            bias = float64(0)
            for b in range(bias_ids.shape[0]):
                if bias_ids[b] == t:
                    bias = float64(bias_values[b])
            delta = bias - float64(frequency) * count - float64(presence)
            logits[s, t] += float32(delta)
    for b in range(tid, bias_ids.shape[0], THREADS):
        t = bias_ids[b]
        generated = False
        for k in range(n if penalised else 0):
            if history[k] == t:
                generated = True
        if t >= 0 and not generated:
            logits[s, t] += float32(float64(bias_values[b]))
    cuda.syncthreads()
