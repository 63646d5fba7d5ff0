"""Every lab task's tests catch a known-wrong answer (instructors' tests; not in the handout).

For each ``Mutant`` of ``mutants.py`` — the reference solution with one plausible mistake — the
lab's own grading (``run_check``, what ``python -m blink_edu.labs check N --task N.k`` runs)
must fail that task, and fail it on a check (an assertion, a rule the plug enforces), not on a
crash of the mutant itself.
"""

from __future__ import annotations

import pytest

from blink_edu import labs
from blink_edu.labs import grading

pytestmark = pytest.mark.skipif(not labs.solutions_available(), reason="needs the solutions")

from mutants import MUTANTS  # noqa: E402 - imports the solutions

CHECK_FAILURES = ("AssertionError", "LabCheckFailed", "LabRuleBroken", "Failed")


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: f"{m.task}: {m.mistake}")
def test_the_lab_fails_a_known_wrong_answer(mutant):
    with labs.substituted(mutant.lab, mutant.module()):
        report = grading.run_check(mutant.lab, task=mutant.task, exitfirst=True)
    assert not report.module_error, report.module_error
    results = report.tasks()[mutant.task]
    assert results, f"no test of task {mutant.task} ran"
    assert mutant.task not in report.passing_tasks(), \
        f"the tests of task {mutant.task} pass an answer with {mutant.mistake}"
    failed = [r for r in results if r.outcome in ("failed", "error")]
    assert any(r.kind in CHECK_FAILURES for r in failed), \
        f"it failed by crashing, not on a check: {[(r.kind, r.message) for r in failed]}"


def test_every_task_has_a_known_wrong_answer():
    assert {m.task for m in MUTANTS} == {t for lab in labs.LABS.values() for t in lab.tasks}
