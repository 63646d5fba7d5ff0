"""Lab 1 — kernels. Each kernel against the NumPy reference on fresh random inputs, then inside
the eager executor generating real tokens (``python -m blink_edu.labs check 1``)."""

from __future__ import annotations

import numpy as np
import pytest

from blink_edu.config import SamplingParams
from blink_edu.kernels.reduce import cuda
from blink_edu.labs.plug import lab1
from blink_edu.model import reference as ref

pytestmark = pytest.mark.lab1


def rel_err(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


def dev(a):
    return cuda.to_device(np.ascontiguousarray(a))


@pytest.mark.task("1.1")
def test_inv_rms_matches_the_reference(rng):
    x = (rng.standard_normal((5, int(rng.integers(20, 50)))) * rng.uniform(0.1, 5, (5, 1)))
    x = x.astype(np.float32)
    eps = float(rng.choice([1e-5, 1e-6]))
    got = lab1.inv_rms_rows(x, eps)
    expected = 1.0 / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=1) + eps)
    np.testing.assert_allclose(got, expected, rtol=1e-5)


@pytest.mark.task("1.1")
def test_inv_rms_of_a_zero_row_is_one_over_sqrt_eps():
    x = np.zeros((2, 8), np.float32)
    x[1] = 3.0  # mean of squares 9 -> 1/3
    got = lab1.inv_rms_rows(x, 1e-4)
    np.testing.assert_allclose(got, [1 / np.sqrt(1e-4), 1 / np.sqrt(9 + 1e-4)], rtol=1e-5)


def gemv_case(rng, rows, wdtype, fused):
    T, I, O = rows + 2, int(rng.integers(20, 45)), int(rng.integers(10, 30))
    x = rng.standard_normal((T, I)).astype(np.float32)
    x_rows = rng.choice(T, rows, replace=False).astype(np.int32)
    w = rng.standard_normal((O, I)).astype(wdtype)
    g = ((1 + 0.2 * rng.standard_normal(I)).astype(np.float32) if fused
         else np.zeros(0, np.float32))
    b = rng.standard_normal(O).astype(np.float32) if fused else np.zeros(0, np.float32)
    residual = rng.standard_normal((rows, O)).astype(np.float32)
    h = ref.rms_norm(x[x_rows], g, 1e-5) if fused else x[x_rows]
    expected = ref.linear(h, w.astype(np.float32), b if fused else None) + (residual if fused else 0)
    out = dev(residual if fused else np.full((rows, O), np.nan, np.float32))
    lab1.launch_gemv(dev(x), dev(x_rows), dev(g), np.float32(1e-5), dev(w), dev(b), out, int(fused))
    return out.copy_to_host(), expected


@pytest.mark.task("1.2")
def test_gemv_plain_matches_the_reference(rng):
    got, expected = gemv_case(rng, rows=3, wdtype=np.float32, fused=False)
    assert rel_err(got, expected) < 1e-5


@pytest.mark.task("1.2")
def test_gemv_with_norm_bias_and_residual_matches_the_reference(rng):
    got, expected = gemv_case(rng, rows=2, wdtype=np.float32, fused=True)
    assert rel_err(got, expected) < 1e-5


@pytest.mark.task("1.2")
def test_gemv_reads_float16_weights(rng):
    got, expected = gemv_case(rng, rows=2, wdtype=np.float16, fused=True)
    assert rel_err(got, expected) < 1e-3


def ragged_batch(rng, n_seqs, block_size, num_blocks, max_len):
    """Per sequence a context length and 1..3 new tokens at its end, with scattered block
    tables. Returns positions (T,), seq_rows (T,), block_tables (S, W)."""
    lengths = rng.integers(1, max_len, size=n_seqs)
    width = -(-int(lengths.max()) // block_size)
    blocks = rng.permutation(num_blocks)
    tables = np.full((n_seqs, width), -1, np.int32)
    used, positions, rows = 0, [], []
    for s, n in enumerate(lengths):
        nb = -(-int(n) // block_size)
        tables[s, :nb] = blocks[used:used + nb]
        used += nb
        new = int(rng.integers(1, min(3, n) + 1))
        positions += range(n - new, n)
        rows += [s] * new
    return np.array(positions, np.int32), np.array(rows, np.int32), tables


@pytest.mark.task("1.3")
@pytest.mark.parametrize("heads,kv_heads", [(2, 2), (4, 1)])
def test_paged_attention_over_a_ragged_batch(rng, heads, kv_heads):
    E, B, N, L = 8, 4, 24, 2
    positions, seq_rows, tables = ragged_batch(rng, 3, B, N, 18)
    T = len(positions)
    q = rng.standard_normal((T, heads, E)).astype(np.float32)
    qkv = np.concatenate([q.reshape(T, -1), rng.standard_normal((T, 2 * kv_heads * E))],
                         1).astype(np.float32)
    pool = (2 * rng.standard_normal((N, L, 2, B, kv_heads, E))).astype(np.float32)
    layer = int(rng.integers(L))
    expected = ref.paged_attention(q, positions, seq_rows, pool, layer, tables).reshape(T, -1)
    out = dev(np.full((T, heads * E), np.nan, np.float32))  # poisoned: every element written
    lab1.launch_attention(dev(qkv), dev(positions), dev(seq_rows), dev(tables), dev(pool), layer,
                          heads, kv_heads, out)
    assert rel_err(out.copy_to_host(), expected) < 1e-5


@pytest.mark.task("1.3")
def test_paged_attention_is_causal_and_follows_the_block_table(rng):
    """One sequence, keys scattered over blocks in reverse order; a token at position p must
    ignore everything after p (the cache holds garbage there)."""
    E, B, N = 8, 2, 6
    table = np.array([[5, 3, 1, 0]], np.int32)
    positions = np.array([2, 3], np.int32)  # two new tokens: positions 2 and 3
    seq_rows = np.zeros(2, np.int32)
    q = rng.standard_normal((2, 1, E)).astype(np.float32)
    qkv = np.concatenate([q.reshape(2, -1), np.zeros((2, 2 * E))], 1).astype(np.float32)
    pool = rng.standard_normal((N, 1, 2, B, 1, E)).astype(np.float32)
    pool[1, 0, :, 0] = 1e4  # position 4 (block 1, slot 0): beyond every token's context
    expected = ref.paged_attention(q, positions, seq_rows, pool, 0, table).reshape(2, -1)
    out = dev(np.full((2, E), np.nan, np.float32))
    lab1.launch_attention(dev(qkv), dev(positions), dev(seq_rows), dev(table), dev(pool), 0, 1, 1,
                          out)
    assert rel_err(out.copy_to_host(), expected) < 1e-5


@pytest.fixture(scope="module")
def micro():
    return lab1.micro_weights(seed=int(np.random.default_rng().integers(1000)))


def end_to_end(micro, rng, use):
    prompts = [rng.integers(3, 64, size=2).tolist() for _ in range(2)]
    greedy = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    got = lab1.generate(micro, prompts, greedy, use=use)
    assert got == ref.generate(micro, prompts, greedy, block_size=lab1.MICRO_ENGINE.block_size)


@pytest.mark.task("1.2")
def test_engine_with_your_gemv_generates_the_reference_tokens(micro, rng):
    end_to_end(micro, rng, use=("gemv",))


@pytest.mark.task("1.3")
def test_engine_with_your_attention_generates_the_reference_tokens(micro, rng):
    end_to_end(micro, rng, use=("attention",))

