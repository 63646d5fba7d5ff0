"""Course labs' tests: markers ``lab1`` … ``lab5`` and ``task("N.k")``, and which code they run.

``tests/labs/test_labN.py`` are the students' visible tests. They run whatever
``blink_edu.labs.implementation`` hands out: the student's code, or with
``BLINK_EDU_LAB_SOLUTIONS=1`` the reference solutions.

In the instructors' repository (where ``blink_edu/labs/solutions`` exists), a plain ``pytest`` run
with ``BLINK_EDU_LAB_SOLUTIONS`` unset does not collect them directly: ``test_labs_meta.py`` runs
them in two subprocesses instead — with the untouched stubs (every one must fail) and with the
reference solutions (every one must pass). Name a file explicitly, or set the variable, to run
them here. In a student handout (no solutions) they are collected as usual.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from blink_edu import labs

LAB_TEST_FILE = re.compile(r"^test_lab[1-9]\.py$")


def pytest_configure(config):
    for n in sorted(labs.LABS):
        config.addinivalue_line(
            "markers", f"lab{n}: a visible test of course lab {n} (python -m blink_edu.labs "
                       f"check {n})")
    config.addinivalue_line(
        "markers", "task(name): the lab task a test checks, e.g. task('1.2'); "
                   "python -m blink_edu.labs check scores tasks by it")


def _instructor_default() -> bool:
    return labs.ENV_VAR not in os.environ and labs.solutions_available()


def _named_on_command_line(path: Path, config) -> bool:
    base = Path(config.invocation_params.dir)
    for arg in config.args:
        target = Path(arg.split("::")[0])
        target = target if target.is_absolute() else base / target
        if target.resolve() == path.resolve():
            return True
    return False


def pytest_ignore_collect(collection_path, config):
    if (LAB_TEST_FILE.match(collection_path.name) and _instructor_default()
            and not _named_on_command_line(collection_path, config)):
        return True  # test_labs_meta.py runs them, with the stubs and with the solutions
    return None


def pytest_report_header(config):
    mode = "reference solutions" if labs.solutions_enabled() else "student code"
    note = (" (instructors' repo: test_labN.py run through test_labs_meta.py)"
            if _instructor_default() else "")
    return f"blink_edu labs: {mode}{note}"
