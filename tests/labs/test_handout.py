"""The student handout builds, holds no solution code, and its lab notebooks execute up to the
first TODO (the cell tagged ``first-todo``, which must stop with the lab's NotImplementedError)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from blink_edu import labs
from blink_edu.labs import handout

pytestmark = pytest.mark.skipif(not labs.solutions_available(),
                                reason="the handout is built from the instructors' repository")

RUN_TO_FIRST_TODO = r'''
import json, sys
import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

nb = nbformat.read(sys.argv[1], as_version=4)
client = NotebookClient(nb, kernel_name="python3", timeout=300,
                        resources={"metadata": {"path": sys.argv[2]}})
result = {"failed_cell": None, "ename": None, "evalue": None, "first_todo": None, "module": None}
with client.setup_kernel():
    for i, cell in enumerate(nb.cells):
        if "first-todo" in cell.metadata.get("tags", []) and result["first_todo"] is None:
            result["first_todo"] = i
        if cell.cell_type != "code":
            continue
        try:
            client.execute_cell(cell, i)
        except CellExecutionError as err:
            result.update(failed_cell=i, ename=err.ename, evalue=err.evalue)
            break
    probe = nbformat.v4.new_code_cell("import blink_edu; print(blink_edu.__file__)")
    nb.cells.append(probe)
    client.execute_cell(probe, len(nb.cells) - 1)
    result["module"] = probe.outputs[0]["text"].strip()
print("RESULT " + json.dumps(result))
'''


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("handout") / "blink_edu_labs"
    summary = handout.build_handout(out)
    return out, summary


def test_the_handout_has_the_stubs_tests_and_notebooks_but_no_solutions(built):
    out, summary = built
    assert "no solutions" in summary
    assert not (out / "blink_edu/labs/solutions").exists()
    assert handout.find_solution_leaks(out) == []
    for lab in labs.LABS.values():
        stub = out / "blink_edu/labs" / f"{lab.module}.py"
        assert stub.read_bytes() == (handout.REPO / "blink_edu/labs" / f"{lab.module}.py").read_bytes()
        assert (out / "tests/labs" / f"test_lab{lab.number}.py").is_file()
        nb = json.loads((out / "notebooks/labs" / lab.notebook).read_text())
        tags = [t for c in nb["cells"] for t in c.get("metadata", {}).get("tags", [])]
        assert "instructor" not in tags and "first-todo" in tags
    for rel in handout.INSTRUCTOR_FILES:
        assert not (out / rel).exists()
    assert (out / "LABS.md").is_file() and (out / "README.md").is_file()


def test_the_scan_finds_a_planted_solution(built, tmp_path):
    out, _ = built
    planted = tmp_path / "copy"
    shutil.copytree(out / "blink_edu/labs", planted / "blink_edu/labs")
    src = handout.REPO / "blink_edu/labs/solutions/lab3_batching.py"
    target = planted / "blink_edu/labs/lab3_batching.py"
    target.write_text(target.read_text() + "\n" + src.read_text().split('"""', 2)[2])
    leaks = handout.find_solution_leaks(planted)
    assert leaks and all(path.endswith("lab3_batching.py") for path, _ in leaks)


def test_the_handout_notebooks_run_up_to_the_first_todo(built):
    out, _ = built
    env = {**os.environ, "PYTHONPATH": str(out)}
    env.pop(labs.ENV_VAR, None)
    procs = []
    for lab in labs.LABS.values():
        nb = out / "notebooks/labs" / lab.notebook
        procs.append((lab, subprocess.Popen(
            [sys.executable, "-c", RUN_TO_FIRST_TODO, str(nb), str(nb.parent)], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
        if len(procs) % 2 == 0:  # two kernels at a time: a 2-core machine
            procs[-2][1].wait()
    for lab, proc in procs:
        log, _ = proc.communicate(timeout=300)
        line = [l for l in log.splitlines() if l.startswith("RESULT ")]
        assert line, log[-3000:]
        result = json.loads(line[-1][len("RESULT "):])
        assert result["module"].startswith(str(out)), "the kernel must import the handout's package"
        assert result["failed_cell"] == result["first_todo"], (lab.notebook, result)
        assert result["ename"] == "NotImplementedError", (lab.notebook, result)
        assert f"Lab {lab.number}." in result["evalue"], (lab.notebook, result)
