"""Fitting the simulator's step-time model to iterations measured on a real engine.

SuperInfer §5 prices a step with a cost model; this module fits one (``CostModel``'s terms) to
what a replay on the engine measured (``bench.replay``), so that the simulator can predict that
engine's own runs (``bench.slo_real``, docs/design.md §9):

    iteration = a + b * batched tokens + s * sequences + c * context tokens
                + d * requests moved + e[policy] * decided + f * mirrored

with tokens and sequences padded to the captured shape when the executor pads
(``config.padded_step_shape``). *decided*: 1 when a RotaSched policy decided that iteration (the
engine described its requests and the policy ranked them); *mirrored*: 1 when DuplexKV kept its
host mirror (a rotating policy). An iteration is everything the loop does from one model step to
the next, which is what the simulator charges for a step.

Two stages, each a least-squares fit with every coefficient >= 0: the step itself (a, b, s, c)
on iterations that moved nobody; then what every other iteration took beyond that step (d, e, f).
One joint fit would let the step's terms soak up the rotation's costs, since the iterations that
rotate are exactly the rotating policy's.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from ..config import padded_step_shape
from .costs import CostModel
from .presets import Preset


class Iteration(NamedTuple):
    """One iteration of a replay loop that ran the model, in the simulator's terms."""

    tokens: int  # batched tokens
    context: int  # context tokens: every scheduled sequence's cached + scheduled tokens
    seqs: int  # sequences in the batch
    model_seconds: float  # inside the executor's step: the model (launch, GPU, sampled tokens)
    moved: int  # requests moved: recomputed, rotated out, rotated in
    decided: int  # 1 if a RotaSched policy decided this iteration (the engine described to it)
    mirrored: int  # 1 if a rotation engine kept its host mirror (a rotating policy)
    seconds: float  # from this iteration's start to the next one's: everything the loop does


@dataclass(frozen=True)
class Calibration:
    """The fitted terms (seconds). ``e``: seconds per decision by policy name (LVF computes
    every request's VLT and sorts them; Waiting-First and Swapped-First only walk two queues).
    ``step_s``: the median plain iteration, the step the SLOs are multiples of. ``padded``:
    tokens and sequences were padded to the captured shape."""

    a: float
    b: float
    s: float
    c: float
    d: float
    e: dict
    f: float
    step_s: float
    padded: bool

    def described(self) -> str:
        shape = " (padded to the captured shape)" if self.padded else ""
        return (f"iteration = {self.a * 1e3:.3f} ms + {self.b * 1e6:.2f} us/token + "
                f"{self.s * 1e6:.1f} us/sequence{shape} + {self.c * 1e9:.0f} ns/context token + "
                f"{self.d * 1e6:.0f} us per request moved + per decision "
                f"({', '.join(f'{p} {t * 1e6:.0f} us' for p, t in self.e.items())}) + "
                f"{self.f * 1e6:.0f} us per step of a rotating policy's host mirror")

    def cost_model(self, block_bytes: int, link) -> CostModel:
        """The simulator's step-time model with these terms (LVF's decision cost)."""
        return CostModel(fixed_s=self.a, per_token_s=self.b, per_context_token_s=self.c,
                         block_bytes=block_bytes, link=link, per_move_s=self.d,
                         per_decision_s=self.e["lvf"], per_mirror_step_s=self.f,
                         per_seq_s=self.s, padded=self.padded)

    def priced(self, preset: Preset, policy: str) -> Preset:
        """``preset`` with ``policy``'s decision cost (LVF's for a policy not calibrated)."""
        per_decision = self.e.get(policy, self.e["lvf"])
        return replace(preset, cost=replace(preset.cost, per_decision_s=per_decision))


def columns(iterations: list[Iteration]) -> Iteration:
    """The iterations as one ``Iteration`` of float64 arrays, (N,) each."""
    return Iteration(*(np.array(v, dtype=np.float64) for v in zip(*iterations)))


def step_columns(its: Iteration, padded: bool) -> np.ndarray:
    """(N, 4) regressors of the step: 1, tokens, sequences, context (padded when the executor
    pads)."""
    tokens, seqs = its.tokens, its.seqs  # (N,) each
    if padded:
        tokens, seqs = np.array([padded_step_shape(int(n), int(t))[::-1]
                                 for n, t in zip(seqs, tokens)], dtype=np.float64).T
    return np.stack([np.ones_like(tokens), tokens, seqs, its.context], axis=1)


def nonnegative_lstsq(design: np.ndarray, y: np.ndarray) -> list[float]:
    """Least squares with every coefficient >= 0: while the fit gives a negative one, drop the
    most negative column (its coefficient is 0) and fit the rest again. (Clamping a negative
    coefficient to 0 after one fit would leave the others fitted to compensate for it.)"""
    active = list(range(design.shape[1]))
    while True:
        coef = np.linalg.lstsq(design[:, active], y, rcond=None)[0]
        if coef.min() >= 0 or len(active) == 1:
            out = [0.0] * design.shape[1]
            for j, v in zip(active, coef):
                out[j] = max(float(v), 0.0)
            return out
        active.pop(int(np.argmin(coef)))


def fit_step(plain: list[Iteration], padded: bool) -> list[float]:
    """[a, b, s, c] from iterations that moved nobody."""
    p = columns(plain)  # (P,) each
    return nonnegative_lstsq(step_columns(p, padded), p.seconds)


def fit_rotation(moving: list[Iteration], step: list[float],
                 padded: bool) -> tuple[float, float, float]:
    """(d, e, f): what each iteration of ``moving`` took beyond ``step``, per request moved,
    per decision and per step of the host mirror."""
    r = columns(moving)  # (R,) each
    left_over = r.seconds - step_columns(r, padded) @ step  # (R,) beyond the step
    d, e, f = nonnegative_lstsq(np.stack([r.moved, r.decided, r.mirrored], axis=1), left_over)
    return d, e, f


def decision_cost(iterations: list[Iteration], step: list[float], d: float, f: float,
                  padded: bool) -> float:
    """A policy's seconds per decision: what its deciding iterations took beyond the step, the
    moves and the mirror (0 if that is negative)."""
    o = columns(iterations)  # (O,) each
    beyond = o.seconds - step_columns(o, padded) @ step - d * o.moved - f * o.mirrored  # (O,)
    return max(0.0, float(beyond[o.decided == 1].mean()))


def iteration_fit(iterations: list[Iteration], cost: CostModel) -> dict:
    """How well a cost model times a measured run's own iterations: their mean, and the model's
    mean for the very same iterations (compute, moves, decisions, mirror; the copies overlap the
    step). A gap here is the step model's error; the rest of a gap between simulated and
    measured latencies comes from the two schedules drifting apart."""
    if not iterations:
        return {}
    modelled = [cost.step_s(i.tokens, i.context, moves=i.moved, decided=bool(i.decided),
                            mirrored=bool(i.mirrored), seqs=i.seqs) for i in iterations]
    return {"mean_iteration_ms": 1e3 * statistics.fmean(i.seconds for i in iterations),
            "mean_iteration_model_ms": 1e3 * statistics.fmean(modelled)}
