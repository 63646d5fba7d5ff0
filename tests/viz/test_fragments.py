"""The drawn fragment layout is the instruction's: fragments gathered by ``fragment_owners`` and
fed to ``mma_m16n8k16`` (the simulator's form in CI, the real ``mma.sync`` on a GPU) give
A @ B + C, and every element of every operand has exactly one owner."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402

from blink_edu.kernels.matmul_tc import mma_m16n8k16  # noqa: E402
from blink_edu.kernels.reduce import cuda  # noqa: E402
from blink_edu.viz.fragments import (LANES, draw_mma_fragments, fragment_owners,  # noqa: E402
                                      scores_as_a_fragment)


def test_every_element_has_one_owner_and_every_lane_its_share():
    owners = fragment_owners()
    expected = {"A": (4, 2), "B": (2, 2), "C": (4, 1)}  # registers a lane holds, values each
    for name, frag in owners.items():
        regs, halves = expected[name]
        assert (frag.lane >= 0).all() and (frag.register >= 0).all()
        slots = set(zip(frag.lane.ravel(), frag.register.ravel(), frag.half.ravel()))
        assert len(slots) == frag.lane.size == LANES * regs * halves  # no slot holds two elements
        assert np.bincount(frag.lane.ravel(), minlength=LANES).tolist() == [regs * halves] * LANES


@cuda.jit
def mma_from_registers(a_words, b_words, c_values, d_values):
    lane = cuda.threadIdx.x
    d_values[lane, 0], d_values[lane, 1], d_values[lane, 2], d_values[lane, 3] = mma_m16n8k16(
        a_words[lane, 0], a_words[lane, 1], a_words[lane, 2], a_words[lane, 3],
        b_words[lane, 0], b_words[lane, 1],
        c_values[lane, 0], c_values[lane, 1], c_values[lane, 2], c_values[lane, 3])


def registers_of(frag, matrix, n_regs, dtype):
    """(LANES, n_regs, halves) of ``matrix``'s values, placed where ``frag`` says they live."""
    halves = int(frag.half.max()) + 1
    regs = np.zeros((LANES, n_regs, halves), dtype)
    regs[frag.lane, frag.register, frag.half] = matrix
    return regs


def test_fragments_gathered_by_the_drawing_multiply_like_numpy(rng):
    owners = fragment_owners()
    A = rng.standard_normal((16, 16)).astype(np.float16)
    B = rng.standard_normal((16, 8)).astype(np.float16)
    C = rng.standard_normal((16, 8)).astype(np.float32)
    a_words = registers_of(owners["A"], A, 4, np.float16).view(np.uint32)[..., 0]  # (32, 4)
    b_words = registers_of(owners["B"], B, 2, np.float16).view(np.uint32)[..., 0]  # (32, 2)
    c_values = registers_of(owners["C"], C, 4, np.float32)[..., 0]  # (32, 4)
    d_values = cuda.to_device(np.full((LANES, 4), np.nan, np.float32))
    mma_from_registers[1, LANES](cuda.to_device(np.ascontiguousarray(a_words)),
                                 cuda.to_device(np.ascontiguousarray(b_words)),
                                 cuda.to_device(np.ascontiguousarray(c_values)), d_values)
    D = d_values.copy_to_host()[owners["C"].lane, owners["C"].register]  # (16, 8)
    np.testing.assert_allclose(D, A.astype(np.float64) @ B.astype(np.float64) + C,
                               rtol=1e-5, atol=1e-5)


def test_the_drawing_labels_every_cell_and_outlines_one_lane():
    fig = draw_mma_fragments(follow=5)
    axes = fig.axes
    assert [len(ax.texts) for ax in axes] == [16 * 16, 16 * 8, 16 * 8]
    assert [len(ax.patches) for ax in axes] == [8, 4, 4]  # lane 5's A, B and C cells
    assert "5\na0" in {t.get_text() for t in axes[0].texts}
    matplotlib.pyplot.close("all")


def test_two_score_tiles_are_the_a_fragment_of_the_next_mma():
    scores, probs = scores_as_a_fragment()
    assert (scores.lane == probs.lane).all()
    # lane 5 (g = 1, t = 1): row 1, positions 2, 3 are c0, c1 of the left tile and a0 of P;
    # row 9, positions 10, 11 are c2, c3 of the right tile (registers 6, 7) and a3
    assert scores.lane[1, 2] == scores.lane[9, 11] == 5
    assert (scores.register[1, 2], scores.register[1, 3], probs.register[1, 2]) == (0, 1, 0)
    assert (scores.register[9, 10], scores.register[9, 11], probs.register[9, 11]) == (6, 7, 3)
