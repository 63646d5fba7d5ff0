"""The switch and the autograder's own logic (instructors' tests; not in the handout)."""

from __future__ import annotations

import pytest

from blink_edu import labs
from blink_edu.labs import grading

pytestmark = pytest.mark.skipif(not labs.solutions_available(), reason="needs the solutions")


def test_the_switch_picks_the_module(monkeypatch):
    monkeypatch.setenv(labs.ENV_VAR, "0")
    assert labs.implementation(3).__name__ == "blink_edu.labs.lab3_batching"
    monkeypatch.setenv(labs.ENV_VAR, "1")
    assert labs.implementation(3).__name__ == "blink_edu.labs.solutions.lab3_batching"
    labs.use_solutions(False)
    try:
        assert labs.implementation(3).__name__ == "blink_edu.labs.lab3_batching"
    finally:
        labs.use_solutions(None)


def test_require_spots_stubs_only():
    from blink_edu.labs import lab1_kernels, lab3_batching
    from blink_edu.labs.solutions import lab1_kernels as sol1
    from blink_edu.labs.solutions import lab3_batching as sol3

    for stub, task in ((lab3_batching.prompt_chunk, "3.2"), (lab1_kernels.inv_rms, "1.1")):
        with pytest.raises(NotImplementedError, match=f"Lab {task}"):
            labs.require(stub, task)
    labs.require(sol3.prompt_chunk, "3.2")
    labs.require(sol1.paged_attention_kernel, "1.3")


def test_check_scores_and_explains(monkeypatch, capsys):
    report = grading.run_check(4, solutions=True)
    assert report.passing_tasks() == list(labs.LABS[4].tasks)
    report = grading.run_check(4, solutions=False, keyword="plan or rotate_out")
    grading.explain(report)
    text = capsys.readouterr().out
    assert "Score: 0/4 tasks passing" in text and "# TODO: Lab 4.4" in text
    monkeypatch.delenv(labs.ENV_VAR, raising=False)


def test_every_test_has_a_hint():
    import ast
    from pathlib import Path

    names = set()
    for path in Path(__file__).parent.glob("test_lab[0-9].py"):
        names |= {n.name for n in ast.parse(path.read_text()).body
                  if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}
    assert names - set(grading.HINTS) == set()


def test_handout_refuses_to_replace_the_repository_or_a_file(tmp_path, capsys):
    """--force replaces a folder, never the repository, a folder holding it, or a file."""
    from blink_edu.labs.__main__ import main
    from blink_edu.labs.handout import REPO

    a_file = tmp_path / "notes.txt"
    a_file.write_text("keep me")
    for target in (REPO, REPO.parent, REPO / "blink_edu", a_file):
        assert main(["handout", str(target), "--force"]) == 2
        assert "error:" in capsys.readouterr().err
    assert a_file.read_text() == "keep me" and (REPO / "README.md").is_file()
