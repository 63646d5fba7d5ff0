"""The ring's slot state machine, drawn (Blink §3; docs/design.md §2.2).

Every arrow is one compare-and-swap of ``ring.layout.TRANSITIONS``; a state's border says who
owns it (the frontend or the engine) and an arrow's colour who makes that move. Chapters 03 and
04 draw it, and colour their own figures with ``STATE_COLORS``.
"""

from __future__ import annotations

from ..ring.layout import STATE_NAMES, TRANSITIONS

#: One colour per slot state, in every chapter's figures.
STATE_COLORS = {
    "EMPTY": "#e6e6e6", "FILLING": "#f2d16b", "PREFILL_PENDING": "#f4a259",
    "PREFILL_PROCESSING": "#d1495b", "DECODE_PROCESSING": "#4d8fd6",
    "DECODE_PAUSED": "#9b6fc4", "DECODE_COMPLETED": "#66b36a",
}
#: One colour per side of the ring.
FRONTEND_COLOR, ENGINE_COLOR = "#2a9d8f", "#b5651d"
#: The states the frontend owns; the engine owns the rest.
FRONTEND_STATES = frozenset({"EMPTY", "FILLING", "DECODE_COMPLETED"})
#: The engine's moves the persistent kernel makes (it never pauses a slot: a preempted request
#: keeps its slot in its PROCESSING state, its lane says where its KV is).
PERSISTENT_MOVES = frozenset({("PREFILL_PENDING", "PREFILL_PROCESSING"),
                              ("PREFILL_PROCESSING", "DECODE_PROCESSING"),
                              ("PREFILL_PROCESSING", "DECODE_COMPLETED"),
                              ("DECODE_PROCESSING", "DECODE_COMPLETED")})
#: What each move is called.
MOVE_NAMES = {("EMPTY", "FILLING"): "reserve", ("FILLING", "PREFILL_PENDING"): "hand over\n+ doorbell",
              ("PREFILL_PENDING", "PREFILL_PROCESSING"): "claim",
              ("PREFILL_PROCESSING", "DECODE_PROCESSING"): "1st token",
              ("DECODE_PROCESSING", "DECODE_PAUSED"): "pause",
              ("DECODE_PAUSED", "DECODE_PROCESSING"): "resume",
              ("PREFILL_PROCESSING", "DECODE_COMPLETED"): "error /\ncancel",
              ("DECODE_PROCESSING", "DECODE_COMPLETED"): "stop, length,\ncancel",
              ("DECODE_PAUSED", "DECODE_COMPLETED"): "cancel", ("DECODE_COMPLETED", "EMPTY"): "release"}
# where each state sits in the drawing (x, y), and how much each curved arrow bends
_POSITIONS = {"EMPTY": (0.0, 0.0), "FILLING": (2.4, 1.6), "PREFILL_PENDING": (5.4, 1.6),
              "PREFILL_PROCESSING": (8.6, 1.6), "DECODE_PROCESSING": (11.6, 0.0),
              "DECODE_PAUSED": (11.6, -1.9), "DECODE_COMPLETED": (5.4, -1.6)}
_BENDS = {("DECODE_PROCESSING", "DECODE_PAUSED"): 0.35, ("DECODE_PAUSED", "DECODE_PROCESSING"): 0.35,
          ("PREFILL_PROCESSING", "DECODE_COMPLETED"): 0.0, ("DECODE_PAUSED", "DECODE_COMPLETED"): -0.1}
# labels nudged off the arrows they would sit on: move -> (dx, dy)
_LABEL_NUDGES = {("DECODE_PAUSED", "DECODE_PROCESSING"): (0.75, 0.0),
                 ("DECODE_PROCESSING", "DECODE_PAUSED"): (-0.7, 0.0),
                 ("DECODE_PAUSED", "DECODE_COMPLETED"): (0.0, -0.35)}


def owner_color(state: str) -> str:
    return FRONTEND_COLOR if state in FRONTEND_STATES else ENGINE_COLOR


def draw_state_machine(ax=None, persistent: bool = False, title: bool = True):
    """Draw every state and move of ``TRANSITIONS`` on ``ax`` (a new figure if None) and return
    the axes. ``persistent``: dash the engine's moves the persistent kernel never makes."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if ax is None:
        _, ax = plt.subplots(figsize=(13, 5))
    ax.text(-1.1, 2.55, "frontend (Blink: the DPU) owns EMPTY, FILLING, DECODE_COMPLETED",
            color=FRONTEND_COLOR, fontsize=9, weight="bold")
    ax.text(13.3, 2.55, "the engine owns the rest", color=ENGINE_COLOR, fontsize=9,
            weight="bold", ha="right")
    nodes = {name: _draw_state(ax, name, x, y) for name, (x, y) in _POSITIONS.items()}
    for src, dst in sorted(TRANSITIONS):
        a, b = STATE_NAMES[src], STATE_NAMES[dst]
        made = not persistent or a in FRONTEND_STATES or (a, b) in PERSISTENT_MOVES
        _draw_move(ax, nodes, a, b, made)
    handles = [Patch(fc="white", ec=FRONTEND_COLOR, lw=2.5, label="a state the frontend owns"),
               Patch(fc="white", ec=ENGINE_COLOR, lw=2.5, label="a state the engine owns"),
               plt.Line2D([], [], color=FRONTEND_COLOR, lw=2, label="the frontend makes this move"),
               plt.Line2D([], [], color=ENGINE_COLOR, lw=2, label="the engine makes this move")]
    if persistent:
        handles.append(plt.Line2D([], [], color="0.4", lw=1.2, ls="--",
                                  label="never made by the persistent kernel"))
    ax.legend(handles=handles, loc="lower left", fontsize=8, frameon=False)
    ax.set(xlim=(-1.4, 13.4), ylim=(-2.6, 2.9))
    ax.axis("off")
    if title:
        ax.set_title("Slot states (from ring.layout.TRANSITIONS): every arrow is one "
                     "compare-and-swap", fontsize=11)
    return ax


def _draw_state(ax, name: str, x: float, y: float):
    label = name.replace("_", "_\n", 1) if len(name) > 12 else name
    return ax.text(x, y, label, ha="center", va="center", fontsize=8.5, weight="bold",
                   bbox=dict(boxstyle="round,pad=0.5", fc=STATE_COLORS[name],
                             ec=owner_color(name), lw=2.5))


def _draw_move(ax, nodes: dict, a: str, b: str, made: bool) -> None:
    color = owner_color(a)
    ax.annotate("", xy=(0.5, 0.5), xycoords=nodes[b], xytext=(0.5, 0.5), textcoords=nodes[a],
                arrowprops=dict(arrowstyle="-|>", color=color, lw=2 if made else 1.2,
                                mutation_scale=16, ls="-" if made else "--", shrinkA=3, shrinkB=3,
                                patchA=nodes[a].get_bbox_patch(), patchB=nodes[b].get_bbox_patch(),
                                connectionstyle=f"arc3,rad={_BENDS.get((a, b), 0.15)}"))
    (xa, ya), (xb, yb) = _POSITIONS[a], _POSITIONS[b]
    dx, dy = _LABEL_NUDGES.get((a, b), (0.0, 0.0))
    ax.text((xa + xb) / 2 + dx, (ya + yb) / 2 + dy, MOVE_NAMES[(a, b)], ha="center",
            va="center", fontsize=7.5, color=color,
            bbox=dict(fc="white", ec="none", pad=0.4, alpha=0.9))
