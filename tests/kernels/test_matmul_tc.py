"""The tensor-core matmul tile against a float64 NumPy reference: in the simulator its scalar form
on tiny ragged shapes (CI), on a GPU the real ``mma.sync`` at the 135M model's shapes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from blink_edu.kernels import matmul_tc
from blink_edu.kernels.matmul_tc import (
    BK, BM, BN, MIN_STEPS_PER_SPLIT, WM, WN, launch_tc_linear, mma_m16n8k16, pack_half2,
    require_tc_operands, tc_matmul_kernel, tc_steps_per_split, tc_work_items, tile_geometry)
from blink_edu.kernels.reduce import THREADS, cuda

FP16_TOL = 1e-2
FUSIONS = ["plain", "norm", "bias+residual", "norm+bias+residual"]


def rel_err(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


def dev(a):
    return cuda.to_device(np.ascontiguousarray(a))


def run_case(rng, R, I, O, fused, steps_per_split=None, num_sms=1):
    """``launch_tc_linear`` (prologue and tile) on fresh random inputs; returns (out, reference)
    without the residual, so that a large residual cannot hide an error in the product."""
    T = R + 3
    x = (2 * rng.standard_normal((T, I))).astype(np.float32)
    x_rows = rng.choice(T, R, replace=False).astype(np.int32)
    w = (rng.standard_normal((O, I)) / np.sqrt(I)).astype(np.float16)
    norm, residual = "norm" in fused, "residual" in fused
    g = (1 + 0.2 * rng.standard_normal(I)).astype(np.float32) if norm else np.zeros(0, np.float32)
    b = rng.standard_normal(O).astype(np.float32) if "bias" in fused else np.zeros(0, np.float32)
    h = x[x_rows].astype(np.float64)  # (R, I)
    if norm:
        h = h / np.sqrt((h * h).mean(axis=1, keepdims=True) + 1e-5) * g
    expected = h @ w.astype(np.float64).T + (b if b.size else 0)  # (R, O)
    start = rng.standard_normal((R, O)).astype(np.float32) if residual \
        else np.full((R, O), np.nan, np.float32)  # poisoned: every element must be written
    out = dev(start)
    row_scale = dev(np.full(R, np.nan, np.float32))  # poisoned: the prologue must fill it
    launch_tc_linear(dev(x), dev(x_rows), dev(g), np.float32(1e-5), dev(w), dev(b), out,
                     int(residual), row_scale, num_sms=num_sms, steps_per_split=steps_per_split)
    got = out.copy_to_host()
    return (got - start if residual else got), expected


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
    for name, value in gpu._asdict().items():
        monkeypatch.setattr(matmul_tc, name, value)
    monkeypatch.setattr(matmul_tc, "A_VALUES", matmul_tc.QUAD * gpu.A_LOADS)
    monkeypatch.setattr(matmul_tc, "B_WORDS", matmul_tc.QUAD * gpu.B_LOADS)
    R, I, O = WM + 5, gpu.BK + 8, gpu.BN + WN // 2  # both warp rows, 2 column tiles, 2 k steps
    assert tc_work_items(R, O, I, 1) == 2 * 2
    got, expected = run_case(rng, R, I, O, "norm+bias+residual", steps_per_split=1)
    assert rel_err(got, expected) < FP16_TOL


def pipelined(monkeypatch, geometry=None):
    """Run the tile as ``BLINK_EDU_TILE_STAGES=3`` builds it (``tc_matmul_pipelined``), with the
    block ``geometry`` given or the module's: in the simulator the module's constants are read as
    the kernel runs."""
    g = geometry or matmul_tc.GEOMETRY
    for name, value in g._asdict().items():
        monkeypatch.setattr(matmul_tc, name, value)
    monkeypatch.setattr(matmul_tc, "STAGES", 3)
    monkeypatch.setattr(matmul_tc, "LOADS", g.A_LOADS + g.B_LOADS)
    monkeypatch.setattr(matmul_tc, "A32_STRIDE", g.BK + 8)
    monkeypatch.setattr(matmul_tc, "A32_TILE", 3 * g.BM * (g.BK + 8))
    monkeypatch.setattr(matmul_tc, "B_STAGES_TILE", 3 * g.BN * g.STRIDE)


# Ragged shapes again; (BM + 3, 4 k steps + 8, BN + 1): more k steps than stages, so that the
# three buffers wrap around, two row tiles and two column tiles looped by one block.
@pytest.mark.parametrize("R,I,O", [(5, 24, 9), (20, 18, 9), (BM + 3, 4 * BK + 8, BN + 1)])
@pytest.mark.parametrize("steps", [None, 1, 2])
def test_the_pipelined_tile_matches_the_reference(rng, monkeypatch, R, I, O, steps):
    pipelined(monkeypatch)
    got, expected = run_case(rng, R, I, O, "norm+bias+residual", steps_per_split=steps)
    assert np.isfinite(got).all()
    assert rel_err(got, expected) < FP16_TOL


def test_the_pipelined_tile_with_the_gpu_geometry(rng, monkeypatch):
    """Four warps over 64 x 64 in 32-wide k steps, as a GPU builds it with three stages."""
    gpu = tile_geometry(128, 32)
    pipelined(monkeypatch, gpu)
    R, I, O = WM + 5, 4 * gpu.BK + 8, gpu.BN + WN // 2  # both warp rows, 2 column tiles, 5 k steps
    got, expected = run_case(rng, R, I, O, "plain")
    assert rel_err(got, expected) < FP16_TOL


def test_tile_stages_are_checked():
    assert matmul_tc.tile_stages(None) == 1 and matmul_tc.tile_stages("3") == 3
    with pytest.raises(ValueError, match="1 or 3"):
        matmul_tc.tile_stages("2")


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
        assert matmul_tc.needs_prologue(some, empty, 1, split)  # a norm: 1 / rms per row
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
                                     dev(w), dev(empty), dev(np.ones(2, np.float32)),
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
def test_the_pipelined_tile_at_the_135m_shapes_on_the_gpu():
    """The real ``cp.async`` tile (``BLINK_EDU_TILE_STAGES=3``, read when the module is imported,
    so in a process of its own): ``tc_matmul_probe --once`` checks every 135M shape at 64, 512 and
    77 tokens against the float64 reference and exits 1 on an error of 1e-2 or more."""
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, BLINK_EDU_TILE_STAGES="3")
    run = subprocess.run([sys.executable, str(root / "tools" / "tc_matmul_probe.py"), "--once",
                          "--rows", "64", "512", "77"], env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "k step 32" in run.stdout  # the pipelined tile's geometry, not the default's
