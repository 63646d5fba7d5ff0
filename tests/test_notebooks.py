"""Every chapter notebook runs top to bottom (docs/design.md §7: notebooks are part of the product).

Each ``notebooks/**/*.ipynb`` (except Jupyter checkpoints and ``notebooks/labs/handout/``, whose
notebooks are exercises with blanks to fill) is executed with nbclient in the ``python3`` kernel,
with the notebook's own folder as working directory, and is its own test id::

    pytest -m notebook                       # all chapters
    pytest "tests/test_notebooks.py::test_notebook_runs[01_model.ipynb]"

A failure shows the failing cell's source and its traceback. If no notebook exists the single
test ``no-notebooks-found`` fails: the project requires its chapters.

The ``python3`` kernel must be the interpreter running pytest (the venv), or the chapters would
import some other Python's packages. ``test_python3_kernel_is_this_interpreter`` checks that.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_DIR = Path(__file__).resolve().parent.parent
NOTEBOOKS_DIR = REPO_DIR / "notebooks"
EXCLUDED_DIRS = [NOTEBOOKS_DIR / "labs" / "handout"]
KERNEL_NAME = "python3"
CELL_TIMEOUT_S = 600

pytestmark = pytest.mark.notebook

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _discover() -> list[Path]:
    found = []
    for path in sorted(NOTEBOOKS_DIR.rglob("*.ipynb")):
        if ".ipynb_checkpoints" in path.parts:
            continue
        if any(path.is_relative_to(excluded) for excluded in EXCLUDED_DIRS):
            continue
        found.append(path)
    return found


def _params() -> list:
    notebooks = _discover()
    if not notebooks:
        return [pytest.param(None, id="no-notebooks-found")]
    return [pytest.param(nb, id=nb.relative_to(NOTEBOOKS_DIR).as_posix()) for nb in notebooks]


@pytest.fixture(scope="session")
def python3_kernel_cmd() -> list[str]:
    """The ``python3`` kernel's command line, checked to run this very interpreter.

    Every notebook test depends on this, so a wrong kernel fails them all with the fix in the
    message instead of running the chapters against some other Python's packages.
    """
    from jupyter_client.kernelspec import NoSuchKernel
    from jupyter_client.manager import KernelManager

    fix = f"run: {sys.executable} -m ipykernel install --sys-prefix"
    try:
        # jupyter_client rewrites argv[0] "python"/"python3" to sys.executable, as at launch.
        cmd = KernelManager(kernel_name=KERNEL_NAME).format_kernel_cmd()
    except NoSuchKernel:
        pytest.fail(f"no '{KERNEL_NAME}' kernelspec is installed; {fix}", pytrace=False)
    # Compare sys.prefix, not resolved executables: a venv's python is a symlink to the
    # system one, so both resolve to the same file while importing different packages.
    prefix = subprocess.run(
        [cmd[0], "-c", "import sys; print(sys.prefix)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if os.path.realpath(prefix) != os.path.realpath(sys.prefix):
        pytest.fail(
            f"the '{KERNEL_NAME}' kernel runs {cmd[0]} (prefix {prefix}), "
            f"not this interpreter (prefix {sys.prefix}); {fix}",
            pytrace=False,
        )
    return cmd


def test_python3_kernel_is_this_interpreter(python3_kernel_cmd: list[str]) -> None:
    # The check itself is in the fixture; this test gives it its own id in the report.
    assert python3_kernel_cmd


@pytest.mark.parametrize("notebook", _params())
def test_notebook_runs(notebook: Path | None, python3_kernel_cmd: list[str]) -> None:
    if notebook is None:
        pytest.fail(
            f"no notebooks found under {NOTEBOOKS_DIR}: the project requires its chapters",
            pytrace=False,
        )

    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    nb = nbformat.read(notebook, as_version=4)
    client = NotebookClient(
        nb,
        kernel_name=KERNEL_NAME,  # whatever kernel name the notebook was saved with
        timeout=CELL_TIMEOUT_S,  # per cell
        allow_errors=False,
        resources={"metadata": {"path": str(notebook.parent)}},  # kernel cwd
    )
    failure = None
    try:
        client.execute()
    except (CellExecutionError, CellTimeoutError) as err:
        # Both messages carry the failing cell's source; CellExecutionError also the traceback.
        failure = _ANSI.sub("", str(err))
    except DeadKernelError as err:
        failure = f"the kernel died: {err}"
    if failure is not None:
        # Fail outside the except block so pytest does not print the chained error twice.
        pytest.fail(f"{notebook.relative_to(REPO_DIR)}:\n{failure}", pytrace=False)
