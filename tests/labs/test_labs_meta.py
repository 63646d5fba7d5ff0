"""The autograder can tell: every lab test FAILS against the untouched stubs and PASSES against the
reference solutions. Both runs are subprocesses (``BLINK_EDU_LAB_SOLUTIONS=0`` / ``=1``), started
together so that they share the machine's cores; their JUnit reports are compared test by test."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from blink_edu import labs
from blink_edu.backend import get_backend

HERE = Path(__file__).resolve().parent
LAB_FILES = sorted(HERE.glob("test_lab[0-9].py"))

pytestmark = pytest.mark.skipif(not labs.solutions_available(),
                                reason="a student handout has no solutions to check against")


def outcomes(junit: Path) -> dict[str, str]:
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        out[name] = ("failed" if kinds & {"failure", "error"} else
                     "skipped" if "skipped" in kinds else "passed")
    return out


@pytest.fixture(scope="module")
def both_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("meta")
    procs = {}
    for mode in ("0", "1"):
        env = {**os.environ, labs.ENV_VAR: mode, "PYTHONHASHSEED": "0"}
        junit = tmp / f"mode{mode}.xml"
        cmd = [sys.executable, "-m", "pytest", *map(str, LAB_FILES), "-q", "-p", "no:cacheprovider",
               "--tb=line", f"--junitxml={junit}", "-o", "junit_family=xunit1"]
        procs[mode] = (subprocess.Popen(cmd, cwd=HERE.parent.parent, env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True), junit)
    results = {}
    for mode, (proc, junit) in procs.items():
        log, _ = proc.communicate(timeout=300)
        results[mode] = (outcomes(junit), log)
    return results


def test_every_lab_test_fails_against_the_untouched_stubs(both_runs):
    results, log = both_runs["0"]
    assert len(results) >= 40, log[-3000:]
    passed = sorted(name for name, outcome in results.items() if outcome != "failed")
    assert not passed, f"these tests do not fail against the stubs (they cannot tell): {passed}"


def test_every_lab_test_passes_against_the_reference_solutions(both_runs):
    results, log = both_runs["1"]
    assert set(results) == set(both_runs["0"][0]), "both runs must collect the same tests"
    allowed_skips = set() if get_backend().is_simulator else {"publish_order"}
    bad = sorted(name for name, outcome in results.items()
                 if outcome == "failed" or (outcome == "skipped"
                                            and not any(s in name for s in allowed_skips)))
    assert not bad, f"failing with the reference solutions: {bad}\n{log[-4000:]}"


def test_every_task_has_tests():
    import ast

    for path in LAB_FILES:
        lab = int(path.stem[-1])
        text = path.read_text()
        marked = {node.args[0].value for node in ast.walk(ast.parse(text))
                  if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "task"}
        assert marked == set(labs.LABS[lab].tasks), f"{path.name}: tasks {sorted(marked)}"
