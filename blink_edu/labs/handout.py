"""``python -m blink_edu.labs handout OUT_DIR``: the student handout, with the solutions stripped.

The handout is the repository as a student gets it — the whole package (the labs plug into the
real engine, ring, rotation and simulator), the chapters, the stubs, the lab notebooks and the
visible tests — minus everything for instructors:

* ``blink_edu/labs/solutions/`` (the reference solutions);
* the instructors' tests of the lab machinery (``INSTRUCTOR_FILES``);
* notebook cells tagged ``instructor`` (in the repository they switch a lab notebook to the
  solutions so that CI can run it top to bottom); outputs are cleared.

It adds ``LABS.md``, the student's guide. After writing, it scans every text file of the handout
for any distinctive line of the solutions (``find_solution_leaks``) and fails if one is there.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from . import LABS

REPO = Path(__file__).resolve().parents[2]
SOLUTIONS_DIR = Path("blink_edu/labs/solutions")
INSTRUCTOR_FILES = {Path("tests/labs/test_labs_meta.py"), Path("tests/labs/test_labs_tooling.py"),
                    Path("tests/labs/test_handout.py"), Path("tests/labs/test_lab_mutants.py"),
                    Path("tests/labs/mutants.py"), Path("tests/labs/test_labs_plug_in_publicly.py")}
SKIP_PARTS = {".git", ".venv", "__pycache__", ".pytest_cache", ".hypothesis", "build",
              ".ipynb_checkpoints", "_build", "jupyter_execute"}
INSTRUCTOR_TAG = "instructor"
FIRST_TODO_TAG = "first-todo"  # the first cell that calls student code (it fails until done)
INSTALL_LABS = "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[labs]'"
TEXT_SUFFIXES = {".py", ".ipynb", ".md", ".txt", ".toml", ".cfg", ".json", ".rst", ".sh", ".yml",
                 ".yaml", ".cu"}


def repo_files(repo: Path = REPO) -> list[Path]:
    """Files of the repository, relative: git's tracked and untracked-but-not-ignored files, or
    (without git) a walk that skips build outputs and environments."""
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=repo,
                             capture_output=True, check=True).stdout.decode()
        files = [Path(p) for p in out.split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        files = [p.relative_to(repo) for p in repo.rglob("*") if p.is_file()]
    return sorted(p for p in files if (repo / p).is_file()
                  and not SKIP_PARTS & set(p.parts) and not p.name.endswith(".egg-info"))


def is_instructor_only(rel: Path) -> bool:
    return (rel.is_relative_to(SOLUTIONS_DIR) or rel in INSTRUCTOR_FILES
            or rel.is_relative_to(Path("notebooks/labs/handout")))


def student_notebook(nb: dict) -> dict:
    """The notebook without its instructor cells, outputs cleared."""
    cells = []
    for cell in nb["cells"]:
        if INSTRUCTOR_TAG in cell.get("metadata", {}).get("tags", []):
            continue
        if cell["cell_type"] == "code":
            cell = {**cell, "outputs": [], "execution_count": None}
        cells.append(cell)
    return {**nb, "cells": cells}


def guide() -> str:
    lines = ["# Course labs", "",
             "Set up once (a light install: no torch):", "",
             "```bash", INSTALL_LABS, "```", "",
             "then for each lab:", "",
             "1. open its notebook in `notebooks/labs/` (`jupyter lab notebooks/labs/`): it "
             "explains the task and stops at the first cell that needs your code;",
             "2. write the functions marked `# TODO: Lab N.k` in `blink_edu/labs/labN_*.py`;",
             "3. check: `python -m blink_edu.labs check N` runs the lab's tests "
             "(`tests/labs/test_labN.py`), explains what fails and prints your score.", "",
             "Everything runs on a laptop without a GPU (Numba's CUDA simulator), and on a GPU "
             "unchanged.", ""]
    for lab in LABS.values():
        lines += [f"## Lab {lab.number}: {lab.title}", "",
                  f"`blink_edu/labs/{lab.module}.py` · `notebooks/labs/{lab.notebook}` · "
                  f"`python -m blink_edu.labs check {lab.number}`", ""]
        lines += [f"- **{task}** {what}" for task, what in lab.tasks.items()] + [""]
    return "\n".join(lines)


def is_source_checkout(repo: Path) -> bool:
    """Whether ``repo`` is the repository (its tests, notebooks and solutions), not the folder
    an installed package sits in (site-packages)."""
    return all((repo / rel).exists() for rel in (Path("pyproject.toml"), Path("tests/labs"),
                                                 Path("notebooks/labs"), SOLUTIONS_DIR))


def build_handout(out_dir, repo: Path = REPO, force: bool = False) -> str:
    """Write the handout into ``out_dir``; returns a one-paragraph summary. Raises if ``repo``
    is not a source checkout, or if the scan finds solution code in the handout."""
    if not is_source_checkout(repo):
        raise ValueError(f"the handout is built from a clone of the blink_edu repository, and "
                         f"this blink_edu is installed in {repo}, which is not one (no "
                         f"pyproject.toml, tests/labs/, notebooks/labs/ and solutions there): "
                         f"clone the repository, `pip install -e .` in it and run this there")
    out = Path(out_dir).resolve()
    # Checked before anything is removed: --force must never delete the repository or a file.
    if (out.is_relative_to(repo) and not out.is_relative_to(repo / "notebooks/labs/handout")
            or repo.is_relative_to(out)):
        raise ValueError(f"write the handout outside the repository (or under "
                         f"notebooks/labs/handout/), not into {out}")
    if out.exists():
        if not out.is_dir():
            raise ValueError(f"{out} is a file, not a folder for the handout")
        if not force and any(out.iterdir()):
            raise FileExistsError(f"{out} exists and is not empty (use --force to replace it)")
        shutil.rmtree(out)
    copied = stripped = 0
    for rel in repo_files(repo):
        if is_instructor_only(rel) or (repo / rel).resolve().is_relative_to(out):
            continue
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if rel.suffix == ".ipynb" and rel.parts[:2] == ("notebooks", "labs"):
            nb = json.loads((repo / rel).read_text())
            student = student_notebook(nb)
            stripped += len(nb["cells"]) - len(student["cells"])
            target.write_text(json.dumps(student, indent=1, ensure_ascii=False) + "\n")
        else:
            shutil.copy2(repo / rel, target)
        copied += 1
    (out / "LABS.md").write_text(guide())
    leaks = find_solution_leaks(out, repo)
    if leaks:
        raise RuntimeError("solution code in the handout:\n" + "\n".join(
            f"  {path}: {line}" for path, line in leaks[:20]))
    return (f"handout written to {out}: {copied} files, {stripped} instructor cell(s) removed, "
            f"no solutions (scanned: no line of blink_edu/labs/solutions/ in it)")


# --- the scan ---------------------------------------------------------------------------------
def _normal(line: str) -> str:
    return " ".join(line.split())


def solution_fingerprints(repo: Path = REPO) -> set[str]:
    """Distinctive lines of the solutions: code lines (not comments, imports, signatures or
    docstrings) of at least 16 characters that appear in no other file of the repository."""
    lines = set()
    for path in sorted((repo / SOLUTIONS_DIR).glob("*.py")):
        for raw in path.read_text().splitlines():
            line = _normal(raw)
            if (len(line) < 16 or line.startswith(("#", "from ", "import ", "def ", "@", '"""'))
                    or line.endswith('"""')):
                continue
            lines.add(line)
    for rel in repo_files(repo):
        if is_instructor_only(rel) or rel.suffix not in TEXT_SUFFIXES:
            continue
        try:
            text = (repo / rel).read_text()
        except (UnicodeDecodeError, OSError):
            continue
        lines -= {_normal(raw) for raw in text.splitlines()}
    return lines


def find_solution_leaks(out_dir, repo: Path = REPO) -> list[tuple[str, str]]:
    """[(file, line)] for every distinctive solution line found in the handout at ``out_dir``,
    plus any file of the solutions folder itself."""
    out = Path(out_dir)
    leaks = [(str(p.relative_to(out)), "(the solutions folder)")
             for p in (out / SOLUTIONS_DIR).rglob("*") if p.is_file()]
    prints = solution_fingerprints(repo)
    for path in sorted(out.rglob("*")):
        if not path.is_file() or path.suffix not in TEXT_SUFFIXES:
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        if path.suffix == ".ipynb":  # code lives in JSON strings: look at the cell sources
            try:
                text = "\n".join("".join(c.get("source", "")) for c in json.loads(text)["cells"])
            except (ValueError, KeyError, TypeError):
                pass
        for raw in text.splitlines():
            if _normal(raw) in prints:
                leaks.append((str(path.relative_to(out)), raw.strip()))
    return leaks
