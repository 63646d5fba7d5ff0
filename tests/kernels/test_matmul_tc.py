"""The tensor-core matmul tile against a float64 NumPy reference: in the simulator its scalar form
on tiny ragged shapes (CI), on a GPU the real ``mma.sync`` at the 135M model's shapes."""

from __future__ import annotations

import numpy as np
import pytest

from blink_edu.kernels import matmul_tc
from blink_edu.kernels.matmul_tc import (
    BK, BM, BN, MIN_STEPS_PER_SPLIT, SWIGLU_GROUP, WM, WN, launch_tc_linear, launch_tc_qkv_rope,
    launch_tc_swiglu, mma_m16n8k16, pack_half2, require_tc_operands, swiglu_columns, tc_matmul_kernel,
    tc_steps_per_split, tc_work_items, tile_geometry)
from blink_edu.kernels.reduce import THREADS, cuda

FP16_TOL = 1e-2
FUSIONS = ["plain", "norm", "bias+residual", "norm+bias+residual"]


def rel_err(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


def dev(a):
    return cuda.to_device(np.ascontiguousarray(a))


def operands(rng, R, I, O, fused):
    """Fresh random x (R + 3, I), x_rows (R,), w (O, I) f16, norm weight g and bias (or empty),
    and the float64 reference h = rms_norm?(x[x_rows]) @ w.T + b (R, O)."""
    T = R + 3
    x = (2 * rng.standard_normal((T, I))).astype(np.float32)
    x_rows = rng.choice(T, R, replace=False).astype(np.int32)
    w = (rng.standard_normal((O, I)) / np.sqrt(I)).astype(np.float16)
    norm = "norm" in fused
    g = (1 + 0.2 * rng.standard_normal(I)).astype(np.float32) if norm else np.zeros(0, np.float32)
    b = rng.standard_normal(O).astype(np.float32) if "bias" in fused else np.zeros(0, np.float32)
    h = x[x_rows].astype(np.float64)  # (R, I)
    if norm:
        h = h / np.sqrt((h * h).mean(axis=1, keepdims=True) + 1e-5) * g
    return x, x_rows, w, g, b, h @ w.astype(np.float64).T + (b if b.size else 0)


def run_case(rng, R, I, O, fused, steps_per_split=None, num_sms=1, row_scale=None):
    """``launch_tc_linear`` (prologue and tile) on fresh random inputs; returns (out, reference)
    without the residual, so that a large residual cannot hide an error in the product."""
    x, x_rows, w, g, b, expected = operands(rng, R, I, O, fused)
    residual = "residual" in fused
    start = rng.standard_normal((R, O)).astype(np.float32) if residual \
        else np.full((R, O), np.nan, np.float32)  # poisoned: every element must be written
    out = dev(start)
    if row_scale is None:
        row_scale = dev(np.full(R, np.nan, np.float32))  # poisoned: a split's prologue fills it
    launch_tc_linear(dev(x), dev(x_rows), dev(g), np.float32(1e-5), dev(w), dev(b), out,
                     int(residual), row_scale, num_sms=num_sms, steps_per_split=steps_per_split)
    got = out.copy_to_host()
    return (got - start if residual else got), expected


def silu_times_up(gate_up):
    """The reference SwiGLU of (R, 2F) [gate | up], float64."""
    F = gate_up.shape[1] // 2
    gate, up = gate_up[:, :F], gate_up[:, F:]
    return gate / (1 + np.exp(-gate)) * up


def run_swiglu_case(rng, R, I, F, fused):
    """``launch_tc_swiglu`` on fresh random inputs: (act (R, F), reference)."""
    x, x_rows, w, g, b, gate_up = operands(rng, R, I, 2 * F, fused)
    act = dev(np.full((R, F), np.nan, np.float32))  # poisoned: every element must be written
    launch_tc_swiglu(dev(x), dev(x_rows), dev(g), np.float32(1e-5), dev(w), dev(b), act)
    return act.copy_to_host(), silu_times_up(gate_up)


def use_geometry(monkeypatch, geometry):
    """Run the tile with another block ``geometry`` (``tile_geometry``) in the simulator, where
    the module's constants are read as the kernel runs."""
    for name, value in geometry._asdict().items():
        monkeypatch.setattr(matmul_tc, name, value)
    monkeypatch.setattr(matmul_tc, "A_VALUES", matmul_tc.QUAD * geometry.A_LOADS)
    monkeypatch.setattr(matmul_tc, "B_WORDS", matmul_tc.QUAD * geometry.B_LOADS)
    monkeypatch.setattr(matmul_tc, "LOADS", geometry.A_LOADS + geometry.B_LOADS)
    monkeypatch.setattr(matmul_tc, "SQ_SHAPE", (geometry.BM, geometry.A_QUADS))


# Ragged on every axis: R not a multiple of 16, I not a multiple of 16 (but even), O odd; the k
# range in one work item (steps None: as many as there are) or split one step a work item, the
# partial tiles meeting in ``out`` through atomic adds.
@pytest.mark.parametrize("R,I,O", [(1, 16, 8), (5, 24, 9), (17, 40, 24), (20, 18, 9)])
@pytest.mark.parametrize("fused", FUSIONS)
@pytest.mark.parametrize("steps", [None, 1])
def test_tc_matmul_matches_reference_on_ragged_shapes(rng, R, I, O, fused, steps):
    got, expected = run_case(rng, R, I, O, fused, steps_per_split=steps)
    assert np.isfinite(got).all()
    assert rel_err(got, expected) < FP16_TOL


@pytest.mark.parametrize("steps", [None, 1, 2])
def test_tc_matmul_over_several_tiles_and_k_steps_in_one_block(rng, steps):
    """More row tiles, column tiles and k steps than one of each, all looped by a single block
    (the grid stride), so both shared buffers, every tile edge and every split are used."""
    R, I, O = BM + 3, 2 * BK + 8, 2 * BN + 1
    assert tc_work_items(R, O, I, steps or 3) == 2 * 3 * -(-3 // (steps or 3))  # 3 k steps
    got, expected = run_case(rng, R, I, O, "norm+bias+residual", steps_per_split=steps)
    assert rel_err(got, expected) < FP16_TOL


def test_the_gpu_tile_geometry_in_the_simulator(rng, monkeypatch):
    """A GPU block is 4 warps (2 x 2) over a 64 x 64 tile in 64-wide k steps; the simulator's is
    one warp. Running the GPU's geometry here too checks the warp-tile offsets and the staging by
    128 threads in CI (on a GPU this is the geometry it has anyway)."""
    gpu = tile_geometry(128, 64)
    use_geometry(monkeypatch, gpu)
    R, I, O = WM + 5, gpu.BK + 8, gpu.BN + WN // 2  # both warp rows, 2 column tiles, 2 k steps
    assert tc_work_items(R, O, I, 1) == 2 * 2
    for steps in (1, None):  # split (the prologue's 1 / rms), then not (the tile's own)
        got, expected = run_case(rng, R, I, O, "norm+bias+residual", steps_per_split=steps)
        assert rel_err(got, expected) < FP16_TOL
    got, expected = run_swiglu_case(rng, R, I, gpu.BN // 2 + 3, "norm")  # 2 column tiles
    assert rel_err(got, expected) < FP16_TOL


def test_an_unsplit_tile_finds_the_norm_itself(rng):
    """With every k step in one block there is no prologue: ``row_scale`` is never written (it
    stays NaN here), the tile adds up its rows' squares as it stages them."""
    row_scale = dev(np.full(BM + 3, np.nan, np.float32))
    got, expected = run_case(rng, BM + 3, 2 * BK + 8, BN + 1, "norm", row_scale=row_scale)
    assert np.isnan(row_scale.copy_to_host()).all()
    assert rel_err(got, expected) < FP16_TOL


# SwiGLU in the tile's epilogue: F not a multiple of the 8-column groups (the last group padded),
# R and I ragged, more than one row and column tile and k step looped by one block.
@pytest.mark.parametrize("R,I,F", [(1, 16, 8), (5, 24, 5), (17, 40, 13), (BM + 3, 2 * BK + 8, BN)])
@pytest.mark.parametrize("fused", ["plain", "norm", "norm+bias"])
def test_the_swiglu_tile_matches_the_reference(rng, R, I, F, fused):
    got, expected = run_swiglu_case(rng, R, I, F, fused)
    assert np.isfinite(got).all()
    assert rel_err(got, expected) < FP16_TOL


def test_the_swiglu_columns_alternate_gate_and_up_groups():
    """Column c of the SwiGLU tile reads row ``gate_up_row(c)`` of [W_gate; W_up]: groups of 8
    gate rows, then the same 8 up rows; padding columns read a real row."""
    F = 13
    assert swiglu_columns(F) == 32
    rows = [matmul_tc.gate_up_row.py_func(c, F) for c in range(swiglu_columns(F))]
    G = SWIGLU_GROUP
    assert rows[:2 * G] == list(range(G)) + list(range(F, F + G))
    assert rows[2 * G:2 * G + 5] == list(range(G, F)) and rows[3 * G:3 * G + 5] == list(range(F + G, 2 * F))
    assert all(0 <= r < 2 * F for r in rows)


def test_the_swiglu_tile_refuses_mismatched_weights(rng):
    x, rows = dev(np.zeros((2, 16), np.float32)), dev(np.arange(2, dtype=np.int32))
    empty = dev(np.zeros(0, np.float32))
    with pytest.raises(ValueError, match="2F"):
        launch_tc_swiglu(x, rows, empty, np.float32(1e-5), dev(np.zeros((10, 16), np.float16)),
                         empty, dev(np.zeros((2, 4), np.float32)))


def test_split_k_fills_the_gpu_but_keeps_some_steps_per_item():
    """A decode batch's few tiles are split along k until they cover the multiprocessors, never
    below MIN_STEPS_PER_SPLIT steps an item; enough tiles are not split at all."""
    k_steps = 24
    I = k_steps * BK
    assert tc_steps_per_split(BM, BN, I, num_sms=1) == k_steps  # one tile fills one SM
    steps = tc_steps_per_split(BM, 9 * BN, I, num_sms=132)  # 9 tiles on 132 SMs
    assert steps == max(MIN_STEPS_PER_SPLIT, 2)  # 24 / 15 splits -> 2 steps each
    assert tc_work_items(BM, 9 * BN, I, steps) >= 9 * 12
    assert tc_steps_per_split(8 * BM, 20 * BN, I, num_sms=132) == k_steps  # 160 tiles: no split


def test_the_prologue_is_skipped_only_when_it_has_nothing_to_do():
    empty, some = np.zeros(0, np.float32), np.ones(4, np.float32)
    for split in (True, False):
        assert not matmul_tc.needs_prologue(empty, empty, 1, split)  # a residual add: nothing
    assert matmul_tc.needs_prologue(some, empty, 1, split=True)  # a norm: 1 / rms per row ...
    assert not matmul_tc.needs_prologue(some, empty, 1, split=False)  # ... unless the tile sees it
    # split k: partial tiles are added onto out, so it must hold the bias / zeros first
    assert matmul_tc.needs_prologue(empty, some, 1, split=True)
    assert matmul_tc.needs_prologue(empty, empty, 0, split=True)
    # unsplit: each block writes its tile whole, the bias added in the tile's epilogue
    assert not matmul_tc.needs_prologue(empty, some, 1, split=False)
    assert not matmul_tc.needs_prologue(empty, empty, 0, split=False)
    assert matmul_tc.is_split(3 * BK, 2) and not matmul_tc.is_split(3 * BK, 3)


def test_mma_fragment_layout_matches_numpy(rng):
    """One warp, one mma: fragments gathered by the layout in the module docstring, exactly as
    ``mma_step`` gathers them from shared memory."""
    A = rng.standard_normal((16, 16)).astype(np.float16)
    B = rng.standard_normal((16, 8)).astype(np.float16)
    C = rng.standard_normal((16, 8)).astype(np.float32)
    a32 = A.view(np.uint32)  # (16, 8): word j of row m = A[m, 2j], A[m, 2j + 1]
    b32 = np.ascontiguousarray(B.T).view(np.uint32)  # (8, 8): word j of column n = B[2j:2j+2, n]
    D = cuda.device_array((16, 8), np.float32)
    one_mma[1, 32](dev(a32), dev(b32), dev(C), D)
    expected = A.astype(np.float64) @ B.astype(np.float64) + C
    np.testing.assert_allclose(D.copy_to_host(), expected, rtol=1e-5, atol=1e-5)


@cuda.jit
def one_mma(a32, b32, c, d):
    lane = cuda.threadIdx.x
    g, t = lane // 4, lane % 4
    r = mma_m16n8k16(a32[g, t], a32[g + 8, t], a32[g, t + 4], a32[g + 8, t + 4],
                     b32[g, t], b32[g, t + 4],
                     c[g, 2 * t], c[g, 2 * t + 1], c[g + 8, 2 * t], c[g + 8, 2 * t + 1])
    d[g, 2 * t], d[g, 2 * t + 1], d[g + 8, 2 * t], d[g + 8, 2 * t + 1] = r


def test_pack_half2_rounds_like_numpy(rng):
    pairs = (rng.standard_normal((THREADS, 2)) * 10.0 ** rng.integers(-3, 4, (THREADS, 1)))
    pairs = pairs.astype(np.float32)
    words = cuda.device_array(THREADS, np.uint32)
    pack_pairs[1, THREADS](dev(pairs), words)
    np.testing.assert_array_equal(words.copy_to_host(), pairs.astype(np.float16).view(np.uint32)[:, 0])


@cuda.jit
def pack_pairs(pairs, words):
    i = cuda.threadIdx.x
    words[i] = pack_half2(pairs[i, 0], pairs[i, 1])


def test_operands_the_tile_cannot_take_are_refused():
    x_rows, out = np.zeros(3, np.int32), np.zeros((3, 8), np.float32)
    with pytest.raises(ValueError, match="even"):
        require_tc_operands(x_rows, np.zeros((8, 15), np.float16), out)
    with pytest.raises(ValueError, match="float16"):
        require_tc_operands(x_rows, np.zeros((8, 16), np.float32), out)
    with pytest.raises(ValueError, match="out"):
        require_tc_operands(x_rows, np.zeros((8, 16), np.float16), np.zeros((3, 9), np.float32))
    require_tc_operands(x_rows, np.zeros((8, 16), np.float16), out)  # a good set passes


def test_float32_weights_are_refused_by_the_kernel(rng):
    """Read as fp16 pairs, float32 weights would be garbage: the kernel refuses them (on a GPU
    when it is compiled, in the simulator when it runs)."""
    x = rng.standard_normal((2, 16)).astype(np.float32)
    w = rng.standard_normal((8, 16)).astype(np.float32)
    empty = np.zeros(0, np.float32)
    with pytest.raises(Exception, match="float16 weights"):
        tc_matmul_kernel[1, THREADS](dev(x), dev(np.arange(2, dtype=np.int32)), dev(empty),
                                     np.float32(1e-5), dev(w), dev(empty),
                                     dev(np.ones(2, np.float32)),
                                     dev(np.zeros((2, 8), np.float32)), 0, 1)


# The 135M model's matrices (O, I) at a decode batch of 64 and a 512-token prompt chunk.
SHAPES_135M = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536),
               "lm_head": (49152, 576)}


@pytest.mark.gpu
@pytest.mark.parametrize("R", [64, 512, 77])
@pytest.mark.parametrize("name", list(SHAPES_135M))
@pytest.mark.parametrize("fused", ["plain", "norm+bias+residual"])
def test_tc_matmul_at_the_135m_shapes_on_the_gpu(rng, R, name, fused):
    """The real ``mma.sync`` with the k range split as the executors split it on this GPU."""
    O, I = SHAPES_135M[name]
    num_sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
    got, expected = run_case(rng, R, I, O, fused, num_sms=num_sms)
    assert rel_err(got, expected) < FP16_TOL


@pytest.mark.gpu
@pytest.mark.parametrize("R", [64, 512, 77])
@pytest.mark.parametrize("fused", ["norm", "norm+bias"])
def test_the_swiglu_tile_at_the_135m_shape_on_the_gpu(rng, R, fused):
    """The real ``mma.sync`` with SwiGLU in the epilogue, the 135M gate/up (2 x 1536, 576)."""
    got, expected = run_swiglu_case(rng, R, 576, 1536, fused)
    assert rel_err(got, expected) < FP16_TOL


# RoPE and the KV write in the tile's epilogue: 1 to 4 query heads a KV head, heads of 16 and 32
# (one and two column groups of 16 a head), more tokens than a row tile (12 sequences of 1 to 3)
@pytest.mark.parametrize("heads,kv_heads,head_dim,norm_bias,n_seqs", [
    (2, 2, 16, True, 5), (4, 1, 16, False, 12), (6, 2, 32, True, 12), (3, 1, 32, False, 3)])
def test_the_qkv_rope_tile_matches_the_reference(rng, heads, kv_heads, head_dim, norm_bias,
                                                 n_seqs):
    from test_fused_gemv import check_qkv_with_rope

    def launch(T, heads, E, args):
        launch_tc_qkv_rope(*args)

    D = int(rng.integers(3, 7)) * 8 + 2  # even, not a multiple of 8: the narrow loads
    check_qkv_with_rope(rng, launch, heads, kv_heads, head_dim, np.float16, FP16_TOL, norm_bias,
                        n_seqs, D)


def test_the_rope_columns_pair_each_element_with_its_partner():
    """Column c of the RoPE tile reads row ``rope_row(c)`` of w_qkv: in each group of 16 of a
    head, 8 pairs' first elements i, then their partners i + E/2; every row exactly once."""
    E, heads = 32, 3
    rows = [matmul_tc.rope_row.py_func(c, E) for c in range(heads * E)]
    assert rows[:16] == list(range(8)) + list(range(16, 24))
    assert rows[16:32] == list(range(8, 16)) + list(range(24, 32))
    assert rows[E:E + 8] == list(range(E, E + 8))
    assert sorted(rows) == list(range(heads * E))
    with pytest.raises(ValueError, match="multiple of 16"):
        launch_tc_qkv_rope(None, dev(np.arange(2, dtype=np.int32)), None, None,
                           dev(np.zeros((3 * 24, 16), np.float16)), *[None] * 7,
                           dev(np.zeros((1, 1, 2, 4, 1, 24), np.float32)), 0, 1, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("n_seqs", [30, 100])
def test_the_qkv_rope_tile_at_the_135m_shape_on_the_gpu(rng, n_seqs):
    """The real ``mma.sync`` with RoPE and the KV write in the epilogue: 9 query and 3 KV heads
    of 64 over hidden 576, ~60 and ~200 tokens of 1 to 3 a sequence."""
    from test_fused_gemv import check_qkv_with_rope

    def launch(T, heads, E, args):
        launch_tc_qkv_rope(*args)

    check_qkv_with_rope(rng, launch, 9, 3, 64, np.float16, FP16_TOL, True, n_seqs, 576)
