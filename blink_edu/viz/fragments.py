"""The fragment layout of one tensor-core instruction, ``mma.sync.m16n8k16``, drawn.

What it teaches: no thread of a warp holds a whole matrix. For ``D (16x8) = A (16x16) @ B (16x8)
+ C`` each of the 32 lanes holds a few registers of each operand, and the hardware knows which
element sits where (the layout is in ``blink_edu/kernels/matmul_tc.py``'s docstring). Lane ``l``
is in group ``g = l // 4`` at position ``t = l % 4``; A and B registers are 32-bit words of two
fp16 values (the lower half is the lower k), C and D registers one float32 each.

``fragment_owners`` says, for every element of A, B and C, which lane holds it, in which of its
registers and in which half; ``draw_mma_fragments`` colours the three matrices by lane group.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

M, N, K = 16, 8, 16  # the instruction's shape: A (M, K) @ B (K, N) + C (M, N)
LANES = 32
GROUP_COLORS = [f"C{g}" for g in range(LANES // 4)]  # one colour per lane group g = lane // 4


class Fragment(NamedTuple):
    """Where each element of one operand lives: three arrays of the operand's shape."""

    prefix: str  # register names: "a" (a0..a3), "b" (b0, b1), "c" (c0..c3)
    lane: np.ndarray  # the lane that holds the element
    register: np.ndarray  # which of that lane's registers
    half: np.ndarray  # 0: the low 16 bits of a 32-bit fp16 pair (the lower k), 1: the high; C: 0


def _empty(shape, prefix) -> Fragment:
    return Fragment(prefix, *(np.full(shape, -1, np.int32) for _ in range(3)))


def fragment_owners() -> dict[str, Fragment]:
    """{"A": ..., "B": ..., "C": ...}: for every element, the lane, register and half holding it."""
    a, b, c = _empty((M, K), "a"), _empty((K, N), "b"), _empty((M, N), "c")
    for lane in range(LANES):
        g, t = lane // 4, lane % 4
        # a0: row g, k 2t..2t+1; a1: row g + 8; a2: row g, k + 8; a3: row g + 8, k + 8
        for reg, (row, k) in enumerate(((g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8),
                                        (g + 8, 2 * t + 8))):
            for half in range(2):
                at = (row, k + half)
                a.lane[at], a.register[at], a.half[at] = lane, reg, half
        # b0: column g, k 2t..2t+1; b1: k + 8
        for reg, k in enumerate((2 * t, 2 * t + 8)):
            for half in range(2):
                at = (k + half, g)
                b.lane[at], b.register[at], b.half[at] = lane, reg, half
        # c0, c1: row g, columns 2t, 2t + 1; c2, c3: row g + 8
        for reg, (row, col) in enumerate(((g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t),
                                          (g + 8, 2 * t + 1))):
            c.lane[row, col], c.register[row, col], c.half[row, col] = lane, reg, 0
    return {"A": a, "B": b, "C": c}


def _draw_operand(ax, frag, follow):
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Rectangle

    rows, cols = frag.lane.shape
    ax.imshow(frag.lane // 4, cmap=ListedColormap(GROUP_COLORS), vmin=-0.5,
              vmax=len(GROUP_COLORS) - 0.5, alpha=0.45, extent=(0, cols, rows, 0),
              interpolation="nearest")
    for (r, col), lane in np.ndenumerate(frag.lane):
        ax.text(col + 0.5, r + 0.5, f"{lane}\n{frag.prefix}{frag.register[r, col]}", ha="center",
                va="center", fontsize=5.5)
        if lane == follow:
            ax.add_patch(Rectangle((col, r), 1, 1, fill=False, ec="black", lw=2))
    ax.set_xticks(np.arange(cols) + 0.5, range(cols), fontsize=7)
    ax.set_yticks(np.arange(rows) + 0.5, range(rows), fontsize=7)
    ax.tick_params(length=0)


def draw_mma_fragments(follow: int = 5):
    """A (16x16), B (16x8) and C/D (16x8) side by side; each cell: the lane that holds it and the
    register, coloured by lane group; lane ``follow``'s cells outlined. Returns the figure."""
    import matplotlib.pyplot as plt

    owners = fragment_owners()
    fig, axes = plt.subplots(1, 3, figsize=(16, 6.4), width_ratios=[K, N, N],
                             gridspec_kw={"wspace": 0.25})
    titles = {"A": "A (16 x 16 fp16): rows m, columns k",
              "B": "B (16 x 8 fp16): rows k, columns n",
              "C": "C and D (16 x 8 float32): rows m, columns n"}
    for ax, (name, frag) in zip(axes, owners.items()):
        _draw_operand(ax, frag, follow)
        ax.set_title(titles[name], fontsize=10)
    g, t = follow // 4, follow % 4
    fig.suptitle(f"mma.sync.m16n8k16: each cell is (lane, register); colour = lane group "
                 f"g = lane // 4; outlined: lane {follow} (g = {g}, t = {t})", y=0.98)
    return fig


def scores_as_a_fragment() -> tuple[Fragment, Fragment]:
    """FlashAttention-2's register trick (``kernels/attention_tc.py``): two neighbouring 16 x 8
    score tiles, side by side as one 16 x 16 matrix, once as the C fragments the first ``mma``
    leaves them in (register ``4 * tile + c``) and once as the A fragment of the second ``mma``.
    Every element sits in the *same lane* in both: ``a0`` packs ``c0, c1`` of tile 0, ``a1`` its
    ``c2, c3``, ``a2`` and ``a3`` the same of tile 1 — no shuffle, no shared memory between the two
    products. Returns (scores as C, probabilities as A); ``ValueError`` if that ever failed."""
    owners = fragment_owners()
    c, a = owners["C"], owners["A"]
    scores = _empty((M, K), "c")
    for tile in range(K // N):
        cols = slice(tile * N, (tile + 1) * N)
        scores.lane[:, cols], scores.register[:, cols] = c.lane, c.register + 4 * tile
        scores.half[:, cols] = c.register % 2  # c0, c2 -> the low half of a pair, c1, c3 the high
    a_register_of_c = np.array([0, 0, 1, 1, 2, 2, 3, 3])  # tile 0 c0..c3, tile 1 c0..c3
    if not ((scores.lane == a.lane).all() and (a_register_of_c[scores.register] == a.register).all()
            and (scores.half == a.half).all()):
        raise ValueError("the score tiles' C fragments are not the A fragment")
    return scores, a


def draw_scores_as_a_fragment(follow: int = 5):
    """The two views of ``scores_as_a_fragment`` side by side, lane ``follow``'s cells outlined.
    Returns the figure."""
    import matplotlib.pyplot as plt

    scores, probs = scores_as_a_fragment()
    fig, axes = plt.subplots(1, 2, figsize=(15, 6.2), gridspec_kw={"wspace": 0.15})
    _draw_operand(axes[0], scores._replace(register=scores.register % 4), follow)
    axes[0].axvline(N, color="black", lw=2)
    axes[0].set_title("S = Q K^T of 16 rows x 16 positions: two C tiles (left: positions 0-7, right: 8-15)",
                      fontsize=9)
    _draw_operand(axes[1], probs, follow)
    axes[1].set_title("P = exp(S - m), the A fragment of P @ V (positions = k)", fontsize=9)
    fig.suptitle(f"The same lane holds each element in both: lane {follow} packs its c0, c1 of the "
                 "left tile into a0, c2, c3 into a1, and the right tile's into a2, a3", y=0.98)
    return fig
