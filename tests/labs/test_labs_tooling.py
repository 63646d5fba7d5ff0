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


def test_check_honours_the_environment_switch(monkeypatch):
    """BLINK_EDU_LAB_SOLUTIONS=1 checks the solutions, as the README says (check used to
    override it with the student's code)."""
    monkeypatch.setenv(labs.ENV_VAR, "1")
    report = grading.run_check(4, task="4.4")
    assert report.passing_tasks() == ["4.4"]
    monkeypatch.setenv(labs.ENV_VAR, "0")
    report = grading.run_check(4, task="4.4")
    assert report.passing_tasks() == []


def test_check_on_the_command_line_says_what_it_checks(monkeypatch, capsys):
    from blink_edu.labs.__main__ import main

    monkeypatch.setenv(labs.ENV_VAR, "1")
    assert main(["check", "4", "--task", "4.3"]) == 0
    text = capsys.readouterr().out
    assert "(checking the reference solutions)" in text and "[PASS] Task 4.3" in text
    assert "[----] Task 4.1 — not checked this time" in text


def _fails_to_import(error: BaseException):
    def implementation(lab):
        raise error
    return implementation


def test_a_syntax_error_in_the_students_file_is_named_as_such(monkeypatch, capsys):
    try:
        compile("def inv_rms(x, row, eps):\n    total = (1 +\n", "lab1_kernels.py", "exec")
    except SyntaxError as err:
        error = err
    monkeypatch.setattr(grading, "implementation", _fails_to_import(error))
    report = grading.run_check(1)
    assert not report.results and report.module_error
    grading.explain(report)
    text = capsys.readouterr().out
    assert "lab1_kernels.py has a SyntaxError on line 2" in text
    assert "Score: 0/3 tasks passing" in text and "--verbose" not in text


def test_an_import_error_in_the_students_file_is_named_as_such(monkeypatch, capsys):
    error = ModuleNotFoundError("No module named 'numpyy'")
    monkeypatch.setattr(grading, "implementation", _fails_to_import(error))
    grading.explain(grading.run_check(3))
    text = capsys.readouterr().out
    assert "blink_edu/labs/lab3_batching.py does not import: ModuleNotFoundError: No module " \
           "named 'numpyy'" in text


def test_a_failure_is_explained_in_numbers_and_names_the_mistake(capsys):
    from mutants import MUTANTS

    no_bias = next(m for m in MUTANTS if m.mistake == "no bias")
    with labs.substituted(1, no_bias.module()):
        report = grading.run_check(1, task="1.2", keyword="norm_bias")
    grading.explain(report)
    text = " ".join(capsys.readouterr().out.split())
    assert "relative error" in text and "tolerance 1e-05" in text
    assert "it equals the result without the bias" in text
    assert "assert " not in text, "no raw pytest assertion"


def test_a_hypothesis_failure_shows_its_example_without_claiming_it_was_printed(capsys):
    from mutants import MUTANTS

    tail = next(m for m in MUTANTS if m.task == "4.1")
    with labs.substituted(4, tail.module()):
        report = grading.run_check(4, task="4.1", keyword="exactly_the_full_ones")
    [result] = report.results
    assert result.outcome == "failed" and "steps=" in result.example
    assert "steps=" not in result.message and "Left contains" not in result.message
    grading.explain(report)
    text = capsys.readouterr().out
    assert f"| {result.example.splitlines()[0]}" in text and "printed above" not in text


def test_the_handout_refuses_an_installed_package(tmp_path):
    """From site-packages (not a clone) there is nothing to build a handout from: say so, write
    nothing."""
    from blink_edu.labs.handout import build_handout

    site = tmp_path / "site-packages"
    (site / "blink_edu/labs").mkdir(parents=True)
    out = tmp_path / "handout"
    with pytest.raises(ValueError, match="not one .*clone the repository"):
        build_handout(out, repo=site)
    assert not out.exists()


def test_the_handouts_guide_names_the_light_install_and_jupyter_lab():
    from blink_edu.labs.handout import guide

    text = guide()
    assert "pip install -e '.[labs]'" in text and "jupyter lab" in text
    assert "[dev]" not in text, "[dev] is 1.7 GB with torch and has no jupyter lab"
