"""The labs' assertions, worded for a student: numbers in words, and the likely mistake named.

A raw ``assert rel_err(got, want) < 1e-5`` fails with ``assert 0.153 < 1e-05``; these fail with
``out: max relative error 0.153, tolerance 1e-05 (12 of 40 values off)`` and, when ``got`` equals
what a known mistake would produce (``mistakes``: a description -> that wrong answer), with that
mistake named: ``... — it equals the result without the bias``. ``python -m blink_edu.labs
check`` shows these messages as they are.
"""

from __future__ import annotations

import numpy as np


class LabCheckFailed(AssertionError):
    """A lab check failed; the message is meant for the student as it is."""


def relative_error(got, want) -> float:
    """||got - want|| / ||want|| in float64 (inf when got has NaNs: an element never written)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return float("inf")
    if not np.isfinite(got).all():
        return float("inf")
    scale = np.linalg.norm(want) or 1.0
    return float(np.linalg.norm(got - want) / scale)


def _mistake(got, mistakes: dict | None, tolerance: float) -> str:
    for description, wrong in (mistakes or {}).items():
        if relative_error(got, wrong) <= max(tolerance, 1e-5):
            return f" — it equals the result {description}"
    return ""


def check_close(got, want, tolerance: float, what: str, mistakes: dict | None = None) -> None:
    """Fail unless ``got`` is within ``tolerance`` (relative, over the whole array) of ``want``."""
    got_a, want_a = np.asarray(got), np.asarray(want)
    if got_a.shape != want_a.shape:
        raise LabCheckFailed(f"{what}: shape {got_a.shape}, expected {want_a.shape}")
    unwritten = int(np.isnan(got_a).sum()) if got_a.dtype.kind == "f" else 0
    if unwritten:
        raise LabCheckFailed(f"{what}: {unwritten} of {got_a.size} values were never written "
                             f"(still NaN): every work item must store its output")
    err = relative_error(got_a, want_a)
    if err <= tolerance:
        return
    off = int((~np.isclose(got_a, want_a, rtol=max(tolerance, 1e-6), atol=1e-6)).sum())
    mistake = _mistake(got_a, mistakes, tolerance)
    raise LabCheckFailed(f"{what}: relative error {err:.3g}, tolerance {tolerance:g} "
                         f"({off} of {got_a.size} values off){mistake}")


def check_values(got, want, rtol: float, what: str) -> None:
    """Fail unless every element of ``got`` is within ``rtol`` of ``want`` (elementwise)."""
    got_a, want_a = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got_a.shape != want_a.shape:
        raise LabCheckFailed(f"{what}: shape {got_a.shape}, expected {want_a.shape}")
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.abs(got_a - want_a) / np.maximum(np.abs(want_a), 1e-300)
    rel = np.where(np.isnan(got_a) | np.isnan(rel), np.inf, rel)
    worst = int(np.argmax(rel))
    if rel.flat[worst] <= rtol:
        return
    raise LabCheckFailed(f"{what}: max relative error {rel.flat[worst]:.3g}, tolerance {rtol:g} "
                         f"(element {worst}: got {got_a.flat[worst]:.6g}, expected "
                         f"{want_a.flat[worst]:.6g}; {int((rel > rtol).sum())} of {rel.size} off)")


def check_tokens(got: list[list[int]], want: list[list[int]], what: str) -> None:
    """Fail unless every request's tokens equal the reference's; name the first difference."""
    if len(got) != len(want):
        raise LabCheckFailed(f"{what}: {len(got)} request(s) came back, expected {len(want)}")
    for i, (g, w) in enumerate(zip(got, want)):
        if g == w:
            continue
        at = next((k for k, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
        detail = (f"token {at}: got {g[at]}, the reference {w[at]}"
                  if at < min(len(g), len(w)) else f"{len(g)} token(s), the reference {len(w)}")
        raise LabCheckFailed(f"{what}: request {i} differs from the NumPy reference at "
                             f"{detail} (got {g}, expected {w})")


def check_equal(got, want, what: str) -> None:
    """Fail unless ``got == want`` (arrays: element for element), saying both."""
    if isinstance(got, np.ndarray) or isinstance(want, np.ndarray):
        same = np.shape(got) == np.shape(want) and bool(np.all(np.asarray(got) == want))
    else:
        same = got == want
    if not same:
        raise LabCheckFailed(f"{what}: got {_show(got)}, expected {_show(want)}")


def check_number(got: float, want: float, what: str, rtol: float = 1e-9) -> None:
    """Fail unless the number ``got`` is within ``rtol`` (relative; absolute near 0) of ``want``."""
    if not abs(got - want) <= rtol * max(abs(want), 1.0):
        raise LabCheckFailed(f"{what}: got {got:.6g}, expected {want:.6g} (tolerance {rtol:g})")


def _show(value) -> str:
    if isinstance(value, np.ndarray):
        value = value.tolist()
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."
