"""Every kernel against the NumPy reference, on fresh random inputs (simulator on CPU, real on GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from blink_edu.config import ModelConfig, SamplingParams
from blink_edu.kernels import attention
from blink_edu.kernels.attention import paged_attention_kernel
from blink_edu.kernels.elementwise import embed_tokens_kernel, swiglu_kernel
from blink_edu.kernels.linear import (GEMV_MAX_ROWS, linear_kernel, linear_work_items,
                                      uses_tensor_cores)
from blink_edu.kernels.reduce import THREADS, block_exclusive_sum, cuda, grid_for
from blink_edu.kernels.rope import rope_and_write_kv_kernel
from blink_edu.executors.step import pack_adjustments
from blink_edu.kernels.sampling import (adjust_logits_kernel, adjust_row_from_history,
                                        sample_rows_kernel)
from blink_edu.kernels.sampling import uniform as ks_uniform
from blink_edu.model import reference as ref
from blink_edu.model.sampling import add_adjustments, logit_adjustments, sample, uniform


def rel_err(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


def dev(a):
    return cuda.to_device(np.ascontiguousarray(a))


def ragged_batch(rng, n_seqs, block_size, num_blocks, max_len):
    """A flat batch: per sequence a context length and 1..3 new tokens at its end, with scattered
    block tables. Returns positions (T,), seq_rows (T,), block_tables (S, W). Lengths stay below
    ``max_len`` and short enough for every sequence's blocks to fit the ``num_blocks``."""
    max_len = min(max_len, (num_blocks // n_seqs) * block_size + 1)
    lengths = rng.integers(1, max_len, size=n_seqs)
    width = -(-int(lengths.max()) // block_size)
    blocks = rng.permutation(num_blocks)
    tables = np.full((n_seqs, width), -1, np.int32)
    used = 0
    positions, rows = [], []
    for s, n in enumerate(lengths):
        nb = -(-int(n) // block_size)
        tables[s, :nb] = blocks[used:used + nb]
        used += nb
        new = int(rng.integers(1, min(3, n) + 1))
        positions += range(n - new, n)
        rows += [s] * new
    return np.array(positions, np.int32), np.array(rows, np.int32), tables


@pytest.mark.parametrize("rows", [1, 3, GEMV_MAX_ROWS + 5])  # GEMV and batched paths
# float16 weights on tensor cores (matmul_tc_decode) past the GEMV, float32 on the FMA tile
@pytest.mark.parametrize("wdtype,tol", [(np.float32, 1e-4), (np.float16, 1e-2)])
@pytest.mark.parametrize("fused", ["plain", "norm+bias+residual"])
@pytest.mark.parametrize("width", ["any", "wide"])  # wide: I % 8 == 0, the 16-byte-load path
def test_linear_matches_reference(rng, rows, wdtype, tol, fused, width):
    I = 8 * int(rng.integers(3, 9)) if width == "wide" else int(rng.integers(20, 70))
    T, O = rows + 2, int(rng.integers(10, 50))
    x = rng.standard_normal((T, I)).astype(np.float32)
    x_rows = rng.choice(T, rows, replace=False).astype(np.int32)
    w = rng.standard_normal((O, I)).astype(wdtype)
    fuse = fused != "plain"
    g = (1 + 0.2 * rng.standard_normal(I)).astype(np.float32) if fuse else np.zeros(0, np.float32)
    b = rng.standard_normal(O).astype(np.float32) if fuse else np.zeros(0, np.float32)
    residual = rng.standard_normal((rows, O)).astype(np.float32)
    h = ref.rms_norm(x[x_rows], g, 1e-5) if fuse else x[x_rows]
    expected = ref.linear(h, w.astype(np.float32), b if fuse else None) + (residual if fuse else 0)
    out = dev(residual)
    tensor_cores = uses_tensor_cores(wdtype)
    linear_kernel[grid_for(linear_work_items(rows, O, tensor_cores)), THREADS](
        dev(x), dev(x_rows), dev(g), np.float32(1e-5), dev(w), dev(b), out, int(fuse),
        tensor_cores)
    assert rel_err(out.copy_to_host(), expected) < (1e-4 if wdtype == np.float32 else tol)


@pytest.mark.parametrize("wdtype", [np.float32, np.float16])
def test_embedding_gather(rng, wdtype):
    embed = rng.standard_normal((50, 24)).astype(wdtype)
    ids = rng.integers(0, 50, size=7).astype(np.int32)
    x = dev(np.full((7, 24), np.nan, np.float32))  # poisoned: every element must be written
    embed_tokens_kernel[grid_for(7), THREADS](dev(embed), dev(ids), x)
    np.testing.assert_array_equal(x.copy_to_host(), embed[ids].astype(np.float32))


def test_swiglu(rng):
    F = 37
    gate_up = (3 * rng.standard_normal((5, 2 * F))).astype(np.float32)
    act = dev(np.full((5, F), np.nan, np.float32))
    swiglu_kernel[grid_for(5), THREADS](dev(gate_up), act)
    expected = ref.silu(gate_up[:, :F]) * gate_up[:, F:]
    assert rel_err(act.copy_to_host(), expected) < 1e-6


def tiny_config(rng, heads=4, kv_heads=2, head_dim=16) -> ModelConfig:
    return ModelConfig.from_dict(dict(
        model_type="llama", vocab_size=64, hidden_size=heads * head_dim, intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=heads, num_key_value_heads=kv_heads,
        head_dim=head_dim, rope_theta=float(rng.choice([100.0, 10000.0]))))


def test_rope_and_kv_write_match_reference(rng):
    cfg = tiny_config(rng)
    H, K, E, B, N = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, 4, 12
    positions, seq_rows, tables = ragged_batch(rng, 3, B, N, 20)
    T = len(positions)
    qkv = rng.standard_normal((T, (H + 2 * K) * E)).astype(np.float32)
    pool = rng.standard_normal((N, 2, 2, B, K, E)).astype(np.float32)
    cos, sin = ref.rope_tables(cfg, np.arange(64))
    layer = 1
    q, k, v = np.split(qkv, [H * E, (H + K) * E], axis=1)
    q_ref = ref.apply_rope(q.reshape(T, H, E), *ref.rope_tables(cfg, positions))
    k_ref = ref.apply_rope(k.reshape(T, K, E), *ref.rope_tables(cfg, positions))
    pool_ref = pool.copy()
    ref.write_kv(pool_ref, layer, k_ref, v.reshape(T, K, E),
                 tables[seq_rows, positions // B], positions % B)
    qkv_d, pool_d = dev(qkv), dev(pool)
    rope_and_write_kv_kernel[grid_for(T), THREADS](qkv_d, dev(positions), dev(seq_rows), dev(tables),
                                                    dev(cos), dev(sin), pool_d, layer, H, K)
    assert rel_err(qkv_d.copy_to_host()[:, :H * E].reshape(T, H, E), q_ref) < 1e-5
    np.testing.assert_allclose(pool_d.copy_to_host(), pool_ref, rtol=1e-5, atol=1e-6)


def attention_inputs(rng, positions, seq_rows, tables, H, K, E, block_size, num_blocks):
    """Random queries, keys and values for a flat batch over a paged pool: the kernel's inputs
    qkv (T, (H + 2K) E), pool (N, layers=2, k/v, B, K, E), layer; and the reference's output
    (T, H E)."""
    T = len(positions)
    q = rng.standard_normal((T, H, E)).astype(np.float32)
    qkv = np.concatenate([q.reshape(T, -1), rng.standard_normal((T, 2 * K * E))], 1).astype(np.float32)
    pool = rng.standard_normal((num_blocks, 2, 2, block_size, K, E)).astype(np.float32)
    layer = int(rng.integers(2))
    expected = ref.paged_attention(q, positions, seq_rows, pool, layer, tables).reshape(T, H * E)
    return (qkv, pool, layer), expected


def run_attention(qkv, positions, seq_rows, tables, pool, layer, H, K, scratch=None):
    """paged_attention_kernel over the whole batch; returns out (T, H E) and the scratch."""
    T, E = len(positions), pool.shape[-1]
    partials, arrivals = scratch or attention.attention_scratch(E)
    out = dev(np.full((T, H * E), np.nan, np.float32))
    grid = grid_for(attention.attention_work_items(T, H, K, E, False))
    paged_attention_kernel[grid, THREADS](dev(qkv), dev(positions), dev(seq_rows), dev(tables),
                                          dev(pool), layer, H, K, out, partials, arrivals)
    return out.copy_to_host(), (partials, arrivals)


# 4, 2, 1 and 3 query heads per KV head; head dims a multiple of 8 (wide loads) and not, and 64
# (more dims than the simulator's 32 threads: the wide path only)
@pytest.mark.parametrize("heads,kv_heads,head_dim", [
    (4, 1, 16), (4, 2, 16), (4, 4, 16), (6, 2, 16), (6, 2, 12), (3, 1, 64)])
def test_paged_attention_over_a_ragged_batch(rng, heads, kv_heads, head_dim):
    cfg = tiny_config(rng, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    H, K, E, B, N = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, 4, 40
    max_len = 3 * THREADS // 2 + 5  # contexts longer than one chunk of THREADS positions
    positions, seq_rows, tables = ragged_batch(rng, 3, B, N, max_len)
    (qkv, pool, layer), expected = attention_inputs(rng, positions, seq_rows, tables, H, K, E, B, N)
    out, _ = run_attention(qkv, positions, seq_rows, tables, pool, layer, H, K)
    assert rel_err(out, expected) < 1e-5
    assert int(tables.max()) >= 8, "the batch should span many KV blocks"


@pytest.mark.parametrize("context", [1, attention.SPAN, attention.SPAN + 1, 5 * attention.SPAN - 3])
def test_split_contexts_merge_to_the_reference_and_leave_no_count(rng, context):
    """One decode token (few pairs: split over spans of SPAN positions, merged by the last split
    to arrive) — twice through the same scratch, as the layers of a step are — and a batch with
    too many pairs to split."""
    H, K, E, B = 6, 2, 16, 4
    width = -(-context // B)
    tables = rng.permutation(width + 3)[:width][None].astype(np.int32)
    positions, seq_rows = np.array([context - 1], np.int32), np.zeros(1, np.int32)
    (qkv, pool, layer), expected = attention_inputs(rng, positions, seq_rows, tables, H, K, E, B,
                                                    width + 3)
    splits = attention.attention_splits(H)
    assert splits > 1 and -(-context // attention.span_of(context, splits)) <= splits
    out, scratch = run_attention(qkv, positions, seq_rows, tables, pool, layer, H, K)
    assert rel_err(out, expected) < 1e-5
    again, scratch = run_attention(qkv, positions, seq_rows, tables, pool, layer, H, K, scratch)
    assert rel_err(again, expected) < 1e-5
    assert not scratch[1].copy_to_host().any(), "the merging split resets its count"


def test_splits_fit_their_scratch():
    for pairs in range(1, 4 * attention.SPLIT_BLOCKS):
        splits = attention.attention_splits(pairs)
        assert 1 <= splits <= attention.MAX_SPLITS
        assert splits == 1 or pairs * splits <= attention.SPLIT_BLOCKS
    assert attention.attention_splits(attention.SPLIT_BLOCKS) == 1  # a b64 decode step's 576


@cuda.jit
def uniform_kernel(seeds, counters, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = ks_uniform(seeds[i], counters[i])


def test_uniform_is_bit_identical_to_the_reference(rng):
    seeds = rng.integers(0, 2**32, size=40, dtype=np.uint64).astype(np.uint32)
    counters = rng.integers(0, 100_000, size=40).astype(np.int32)
    out = dev(np.full(40, -1.0, np.float32))
    uniform_kernel[1, 64](dev(seeds), dev(counters), out)
    assert out.copy_to_host().tolist() == [uniform(int(s), int(c)) for s, c in zip(seeds, counters)]


@pytest.mark.parametrize("case", ["greedy", "temperature", "top_k", "top_p", "top_k+top_p"])
def test_sampling_matches_reference(rng, case):
    S, V = (3 if case == "greedy" else 2), 300  # every bisection probe is slow in the simulator
    logits = (2 * rng.standard_normal((S, V))).astype(np.float32)
    logits[0, rng.integers(V)] = logits[0].max()  # an exact tie for greedy to break
    params = {
        "greedy": SamplingParams(temperature=0),
        "temperature": SamplingParams(temperature=0.7),
        "top_k": SamplingParams(temperature=1.3, top_k=int(rng.integers(2, 40))),
        "top_p": SamplingParams(temperature=0.9, top_p=float(rng.uniform(0.3, 0.95))),
        "top_k+top_p": SamplingParams(temperature=1.1, top_k=20, top_p=0.6),
    }[case]
    seeds = rng.integers(0, 2**31, size=S).astype(np.uint32)
    counters = rng.integers(0, 1000, size=S).astype(np.int32)
    out = dev(np.full(S, -1, np.int32))
    sample_rows_kernel[grid_for(S), THREADS](
        dev(logits), dev(np.full(S, params.temperature, np.float32)),
        dev(np.full(S, params.top_p, np.float32)), dev(np.full(S, params.top_k, np.int32)),
        dev(seeds), dev(counters), out)
    expected = [sample(logits[s], params, int(seeds[s]), int(counters[s])) for s in range(S)]
    assert out.copy_to_host().tolist() == expected


def test_sampling_with_logit_adjustments_matches_reference(rng):
    """logit_bias and penalties: the adjustment kernel, then the sampler, give the reference's
    tokens (greedy and sampled rows; one row without adjustments among them)."""
    S, V = 3, 300
    logits = (2 * rng.standard_normal((S, V))).astype(np.float32)
    outputs = [rng.integers(0, V, size=12).tolist() for _ in range(S)]
    params = [SamplingParams(temperature=0, frequency_penalty=1.5, presence_penalty=0.5,
                             logit_bias=((int(np.argmax(logits[0])), -100.0),)),
              SamplingParams(temperature=0.9, logit_bias=((int(rng.integers(V)), 100.0),)),
              SamplingParams(temperature=0)]
    ids, deltas, lengths = pack_adjustments(params, outputs)
    seeds = rng.integers(0, 2**31, size=S).astype(np.uint32)
    counters = np.array([len(o) for o in outputs], np.int32)
    d_logits, out = dev(logits), dev(np.full(S, -1, np.int32))
    adjust_logits_kernel[grid_for(S), THREADS](d_logits, dev(ids), dev(deltas), dev(lengths))
    sample_rows_kernel[grid_for(S), THREADS](
        d_logits, dev(np.array([p.temperature for p in params], np.float32)),
        dev(np.ones(S, np.float32)), dev(np.zeros(S, np.int32)), dev(seeds), dev(counters), out)
    expected = [sample(logits[s], params[s], int(seeds[s]), int(counters[s]), outputs[s])
                for s in range(S)]
    assert out.copy_to_host().tolist() == expected
    assert expected[0] != int(np.argmax(logits[0])) and expected[1] == params[1].logit_bias[0][0]


@cuda.jit
def adjust_from_history_kernel(logits, histories, lengths, presence, frequency, bias_ids,
                               bias_values):
    s = cuda.blockIdx.x
    adjust_row_from_history(logits, s, histories[s], lengths[s], presence[s], frequency[s],
                            bias_ids[s], bias_values[s])


def test_adjusting_from_the_history_is_bit_identical_to_the_reference(rng):
    """The persistent kernel's way (from a request's record in the ring) adds exactly the
    reference's float32 deltas: repeated tokens, biased tokens generated or not, a row
    without penalties, -1 padding."""
    S, V, O, B = 3, 200, 24, 4
    logits = (2 * rng.standard_normal((S, V))).astype(np.float32)
    histories = rng.integers(0, 30, size=(S, O)).astype(np.int32)  # small range: repeats
    lengths = np.array([O, 11, 7], np.int32)
    presence = rng.uniform(-2, 2, size=S).astype(np.float32)
    frequency = rng.uniform(-2, 2, size=S).astype(np.float32)
    presence[2] = frequency[2] = 0  # row 2: bias only
    bias_ids = np.full((S, B), -1, np.int32)
    bias_values = np.zeros((S, B), np.float32)
    for s in range(S):
        # distinct ids (a logit_bias names a token once): two generated ones, three never generated
        ids = rng.choice(np.unique(np.r_[histories[s, :2], rng.choice(np.arange(30, V), 3,
                                                                      replace=False)]),
                         3, replace=False)
        bias_ids[s, :3] = ids
        bias_values[s, :3] = rng.uniform(-100, 100, size=3)
    expected = []
    for s in range(S):
        params = SamplingParams(presence_penalty=float(presence[s]),
                                frequency_penalty=float(frequency[s]),
                                logit_bias=tuple((int(t), float(b)) for t, b in
                                                 zip(bias_ids[s, :3], bias_values[s, :3])))
        expected.append(add_adjustments(logits[s], *logit_adjustments(
            params, histories[s, :lengths[s]].tolist())))
    out = dev(logits)
    adjust_from_history_kernel[S, THREADS](out, dev(histories), dev(lengths), dev(presence),
                                           dev(frequency), dev(bias_ids), dev(bias_values))
    assert np.array_equal(out.copy_to_host(), np.stack(expected))


@cuda.jit
def exclusive_sum_kernel(values, before, totals):
    """Each thread of one block: the sum of the values of the threads before it, and of all."""
    scratch = cuda.shared.array(THREADS, np.int32)
    b, t = block_exclusive_sum(values[cuda.threadIdx.x], scratch)
    before[cuda.threadIdx.x] = b
    totals[cuda.threadIdx.x] = t


def test_block_exclusive_sum_matches_cumsum(rng):
    """The block-wide scan the persistent kernel plans its steps with: warp shuffles on a GPU,
    the serial form in the simulator; both against NumPy."""
    values = rng.integers(0, 600, size=THREADS).astype(np.int32)
    values[rng.random(THREADS) < 0.3] = 0  # lanes that run nothing this step
    before, totals = np.zeros(THREADS, np.int32), np.zeros(THREADS, np.int32)
    exclusive_sum_kernel[1, THREADS](values, before, totals)
    np.testing.assert_array_equal(before, np.cumsum(values) - values)
    assert (totals == values.sum()).all()
