"""Each documented command works on exactly the install the README names for it.

The README tells a reader to ``pip install -e '.[book]'`` before building the book, ``'.[labs]'``
before ``python -m blink_edu.labs check N``, ``'.[notebooks]'`` before running the chapters, and
plain ``-e .`` before ``serve``, ``generate`` and the benchmarks. A chapter that imports a package
only ``[dev]`` has works in CI (which installs ``[dev]``) and fails for that reader. This test
reads the import statements of what each command runs — notebook code cells, the lab tests, the
entry modules — follows ``blink_edu``'s own module-level imports (importing
``blink_edu.sim.metrics`` runs every module it imports at its top), and checks that pyproject's
base dependencies plus that one extra name a distribution for every third-party import.

A function-level import is not followed: those are the package's deliberate optional imports
(CuPy on a GPU, ``torch`` in a parity benchmark). ``.ci/run`` also runs each command from a fresh
venv with only its extra, which catches what this static reading cannot.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "blink_edu"
LOCAL_TEST_MODULES = {p.stem for p in (REPO / "tests").glob("*.py")}

# An import whose distribution has another name, or that arrives with a distribution that
# depends on it for certain (IPython is ipykernel's own dependency).
PROVIDED_BY = {
    "IPython": {"ipython", "ipykernel"},
    "prometheus_client": {"prometheus-client"},
    "numba": {"numba", "numba-cuda"},
    "llvmlite": {"llvmlite", "numba"},
    "pydantic": {"pydantic", "fastapi"},
    "starlette": {"starlette", "fastapi"},
    "_pytest": {"pytest"},
    "packaging": {"packaging", "pytest"},
}

# What each documented command runs: (the extra the README names, the files it executes).
CHAPTERS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
LAB_NOTEBOOKS = sorted((REPO / "notebooks" / "labs").glob("lab*.ipynb"))
LAB_CHECK = [REPO / "blink_edu/labs/__main__.py", REPO / "blink_edu/labs/grading.py",
             REPO / "tests/conftest.py", *sorted((REPO / "tests/labs").glob("conftest.py")),
             *sorted((REPO / "tests/labs").glob("test_lab[0-9].py"))]
BASE_COMMANDS = [REPO / "blink_edu/serve/__main__.py", REPO / "blink_edu/serve/launcher.py",
                 REPO / "blink_edu/serve/app.py", REPO / "blink_edu/generate.py",
                 REPO / "blink_edu/llm.py",
                 *sorted(p for p in (REPO / "blink_edu/bench").glob("*.py")  # the runnable ones
                         if p.name != "__init__.py" and "__main__" in p.read_text())]
COMMANDS = {
    "": BASE_COMMANDS,  # pip install -e .
    "book": CHAPTERS,  # pip install -e '.[book]' && python tools/build_book.py
    "notebooks": CHAPTERS,  # pip install -e '.[notebooks]' && jupyter lab
    "labs": LAB_NOTEBOOKS + LAB_CHECK,  # pip install -e '.[labs]' && python -m blink_edu.labs ...
}


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def distributions(extra: str) -> set[str]:
    """The normalised names pyproject lists for the base install plus ``extra``."""
    project = pyproject()["project"]
    reqs = list(project["dependencies"])
    if extra:
        reqs += project["optional-dependencies"][extra]
    return {re.sub(r"[-_.]+", "-", Requirement(r).name).lower() for r in reqs}


def code_of(path: Path) -> str:
    """Python source of a module, or of a notebook's code cells (IPython magics dropped)."""
    if path.suffix != ".ipynb":
        return path.read_text()
    cells = ["".join(c["source"]) for c in json.loads(path.read_text())["cells"]
             if c["cell_type"] == "code"]
    return "\n".join(line for cell in cells for line in cell.splitlines()
                     if not line.lstrip().startswith(("%", "!")))


def imported_modules(tree: ast.Module, module: str | None, top_level_only: bool) -> set[str]:
    """Dotted names imported by ``tree`` (relative imports resolved against ``module``);
    ``top_level_only``: what runs at import (not inside a function or class body)."""
    if top_level_only:
        nodes = [n for stmt in tree.body if not isinstance(
            stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for n in ast.walk(stmt)]
    else:
        nodes = list(ast.walk(tree))
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            prefix = node.module or ""
            if node.level:
                parts = module.split(".")
                is_package = (REPO / Path(*parts)).is_dir()
                base = ".".join(parts[:len(parts) - node.level + is_package])
                prefix = f"{base}.{node.module}" if node.module else base
            names.add(prefix)
            names |= {f"{prefix}.{alias.name}" for alias in node.names}
    return names


def package_file(dotted: str) -> Path | None:
    """The file of a ``blink_edu`` module or package, None if the name is not one (an
    attribute imported with ``from package import name``)."""
    path = REPO / Path(*dotted.split("."))
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


def third_party_imports(paths: list[Path]) -> dict[str, str]:
    """{top-level third-party module: the file that imports it}, following blink_edu's own
    module-level imports (and every package __init__ on the way)."""
    found: dict[str, str] = {}
    todo = [(p, None, p.is_relative_to(REPO / PACKAGE)) for p in paths]
    seen: set[Path] = set()
    while todo:
        path, module, top_only = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        if module is None and path.is_relative_to(REPO / PACKAGE) and path.suffix == ".py":
            module = ".".join(path.relative_to(REPO).with_suffix("").parts)
            module = module.removesuffix(".__init__")
        for name in imported_modules(ast.parse(code_of(path)), module, top_only):
            top = name.split(".")[0]
            if top == PACKAGE:
                parts = name.split(".")
                for i in range(1, len(parts) + 1):
                    target = package_file(".".join(parts[:i]))
                    if target is not None:
                        todo.append((target, ".".join(parts[:i]), True))
            elif top in LOCAL_TEST_MODULES:
                todo.append((REPO / "tests" / f"{top}.py", None, True))
            elif top not in sys.stdlib_module_names and top != "__future__":
                found.setdefault(top, str(path.relative_to(REPO)))
    return found


@pytest.mark.parametrize("extra", sorted(COMMANDS), ids=lambda e: e or "base")
def test_the_extra_names_every_package_its_commands_import(extra):
    files = COMMANDS[extra]
    assert files, f"nothing found to check for [{extra}]"
    named = distributions(extra)
    missing = {module: where for module, where in third_party_imports(files).items()
               if not (PROVIDED_BY.get(module, {module.lower().replace("_", "-")}) & named)}
    install = f"pip install -e '.[{extra}]'" if extra else "pip install -e ."
    assert not missing, (f"after `{install}` these imports fail (module: first file importing it): "
                         f"{missing}; add their distributions to pyproject's "
                         f"{'[' + extra + '] extra' if extra else 'dependencies'}")


def test_the_labs_extra_is_light_and_has_what_the_handout_says():
    labs = distributions("labs")
    assert {"pytest", "hypothesis", "jupyterlab"} <= labs
    assert not {"torch", "transformers"} & labs, "the labs need no parity oracle"


def test_the_reader_finds_every_extra_in_the_readme():
    readme = (REPO / "README.md").read_text()
    for extra in ("labs", "notebooks", "book"):
        assert f"pip install -e '.[{extra}]'" in readme, f"README never says to install [{extra}]"


def test_the_walk_follows_blink_edus_own_imports(tmp_path):
    """The reading that catches a chapter importing something through the package."""
    chapter = tmp_path / "probe.ipynb"
    chapter.write_text(json.dumps({"cells": [
        {"cell_type": "code",
         "source": ["%matplotlib inline\n", "from blink_edu.serve import app"]},
        {"cell_type": "markdown", "source": ["import nothing_here"]}]}))
    found = third_party_imports([chapter])
    assert {"fastapi", "prometheus_client"} <= set(found) and "nothing_here" not in found
    assert "matplotlib" not in found
