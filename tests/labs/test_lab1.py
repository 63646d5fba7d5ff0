"""Lab 1 — kernels. Each kernel against the NumPy reference on fresh random inputs, then inside
the eager executor generating real tokens (``python -m blink_edu.labs check 1``).

The shapes are chosen so that plausible wrong kernels fail: rows that are not 0..R-1, query heads
over kv heads at 4/2 and 8/4 (where ``h % K`` and ``h // (H // K)`` disagree), block tables out of
order, garbage after each token's position. A failure names the mistake when the output equals
what that mistake would produce.
"""

from __future__ import annotations

import numpy as np
import pytest

from blink_edu.config import SamplingParams
from blink_edu.kernels.reduce import cuda
from blink_edu.labs.checks import check_close, check_tokens, check_values
from blink_edu.labs.plug import lab1
from blink_edu.model import reference as ref

pytestmark = pytest.mark.lab1


def dev(a):
    return cuda.to_device(np.ascontiguousarray(a))


@pytest.mark.task("1.1")
def test_inv_rms_matches_the_reference(rng):
    x = (rng.standard_normal((5, int(rng.integers(20, 50)))) * rng.uniform(0.1, 5, (5, 1)))
    x = x.astype(np.float32)
    eps = float(rng.choice([1e-5, 1e-6]))
    got = lab1.inv_rms_rows(x, eps)
    expected = 1.0 / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=1) + eps)
    check_values(got, expected, 1e-5, "inv_rms of each row")


@pytest.mark.task("1.1")
def test_inv_rms_of_a_zero_row_is_one_over_sqrt_eps():
    x = np.zeros((2, 8), np.float32)
    x[1] = 3.0  # mean of squares 9 -> 1/3
    got = lab1.inv_rms_rows(x, 1e-4)
    check_values(got, [1 / np.sqrt(1e-4), 1 / np.sqrt(9 + 1e-4)], 1e-5,
                 "inv_rms of a zero row and of a row of 3s (eps=1e-4)")


def gemv_case(rng, rows, wdtype, fused):
    """Runs the lab's GEMV on random inputs; returns (got, expected, {mistake: its output})."""
    T, I, O = rows + 2, int(rng.integers(20, 45)), int(rng.integers(10, 30))
    x = rng.standard_normal((T, I)).astype(np.float32)
    x_rows = rng.choice(T, rows, replace=False).astype(np.int32)
    x_rows[0] = T - 1  # never just 0..R-1: reading row r instead of x_rows[r] must show
    w = rng.standard_normal((O, I)).astype(wdtype)
    w32 = w.astype(np.float32)
    g = ((1 + 0.2 * rng.standard_normal(I)).astype(np.float32) if fused
         else np.zeros(0, np.float32))
    b = rng.standard_normal(O).astype(np.float32) if fused else np.zeros(0, np.float32)
    residual = rng.standard_normal((rows, O)).astype(np.float32)

    def result(rows_of_x, norm=True, bias=True, add_residual=True, scale=True):
        h = x[rows_of_x]
        if fused and norm:
            h = ref.rms_norm(h, g, 1e-5) if scale else h * g
        out = ref.linear(h, w32, b if fused and bias else None)
        return out + residual if fused and add_residual else out

    expected = result(x_rows)
    mistakes = {"reading row r of x instead of row x_rows[r]": result(np.arange(rows))}
    if fused:
        mistakes.update({"without the bias": result(x_rows, bias=False),
                         "without the residual (accumulate=1 must add onto out)":
                             result(x_rows, add_residual=False),
                         "without the RMSNorm": result(x_rows, norm=False),
                         "with norm_w but without the inv_rms scale": result(x_rows, scale=False)})
    out = dev(residual if fused else np.full((rows, O), np.nan, np.float32))
    lab1.launch_gemv(dev(x), dev(x_rows), dev(g), np.float32(1e-5), dev(w), dev(b), out, int(fused))
    return out.copy_to_host(), expected, mistakes


@pytest.mark.task("1.2")
def test_gemv_plain_matches_the_reference(rng):
    got, expected, mistakes = gemv_case(rng, rows=3, wdtype=np.float32, fused=False)
    check_close(got, expected, 1e-5, "out (no norm, no bias)", mistakes)


@pytest.mark.task("1.2")
def test_gemv_with_norm_bias_and_residual_matches_the_reference(rng):
    got, expected, mistakes = gemv_case(rng, rows=2, wdtype=np.float32, fused=True)
    check_close(got, expected, 1e-5, "out (RMSNorm, bias, accumulate=1)", mistakes)


@pytest.mark.task("1.2")
def test_gemv_reads_float16_weights(rng):
    got, expected, mistakes = gemv_case(rng, rows=2, wdtype=np.float16, fused=False)
    check_close(got, expected, 1e-3, "out with float16 weights (no norm, no bias)", mistakes)


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


def attention_mistakes(q, positions, seq_rows, pool, layer, tables) -> dict:
    """What two plausible wrong kernels compute: the wrong GQA mapping, and no causal mask."""
    H, K = q.shape[1], pool.shape[4]
    modulo = pool[..., [h % K for h in range(H)], :]  # kv head h % K, one per query head
    T = len(positions)
    last = np.array([positions[seq_rows == seq_rows[t]].max() for t in range(T)], np.int32)
    return {
        "of kv head h % K for query head h (GQA maps h to kv head h // (H // K))":
            ref.paged_attention(q, positions, seq_rows, modulo, layer, tables).reshape(T, -1),
        "of attending to every new token of the sequence (no causal mask)":
            ref.paged_attention(q, last, seq_rows, pool, layer, tables).reshape(T, -1),
    }


@pytest.mark.task("1.3")
@pytest.mark.parametrize("heads,kv_heads", [(2, 2), (4, 1), (4, 2), (8, 4)])
def test_paged_attention_over_a_ragged_batch(rng, heads, kv_heads):
    """4/2 and 8/4 (the bundled model's) are where h % K and h // (H // K) disagree."""
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
    check_close(out.copy_to_host(), expected, 1e-5,
                f"attention output ({heads} query heads over {kv_heads} kv heads)",
                attention_mistakes(q, positions, seq_rows, pool, layer, tables))


@pytest.fixture(scope="module")
def micro():
    return lab1.micro_weights(seed=int(np.random.default_rng().integers(1000)))


def end_to_end(micro, rng, use):
    prompts = [rng.integers(3, 64, size=2).tolist() for _ in range(2)]
    greedy = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    got = lab1.generate(micro, prompts, greedy, use=use)
    check_tokens(got, ref.generate(micro, prompts, greedy, block_size=lab1.MICRO_ENGINE.block_size),
                 f"greedy tokens of the eager executor with your {' and '.join(use)} kernel")


@pytest.mark.task("1.2")
def test_engine_with_your_gemv_generates_the_reference_tokens(micro, rng):
    end_to_end(micro, rng, use=("gemv",))


@pytest.mark.task("1.3")
def test_engine_with_your_attention_generates_the_reference_tokens(micro, rng):
    end_to_end(micro, rng, use=("attention",))

