#!/usr/bin/env python
"""Build the blink_edu book (HTML) from book/ and the chapters in notebooks/.

    python tools/build_book.py            # full, fresh build: every chapter is executed
    python tools/build_book.py -- -j 2    # anything after "--" goes to sphinx-build

Runs ``sphinx-build -W --keep-going -T -E -b html book book/_build/html`` with the interpreter that
runs this script (so the venv's Sphinx and the venv's python3 kernel are used), prints the wall
time and where the HTML is, and exits with sphinx-build's status (non-zero on any warning or any
failing notebook cell).

-W: every warning is an error (a broken cross-reference, a chapter missing from the toctree, a
    notebook that fails to execute). --keep-going: report all of them, then fail.
-T: print the full traceback when the build aborts. A failing chapter cell aborts the build
    (book/conf.py: nb_execution_raise_on_error = True), and only with -T does the log show the
    failing cell's source and its traceback instead of just the notebook's path.
-E: always start from a fresh environment, so every chapter is re-read and therefore re-executed
    (book/conf.py sets nb_execution_mode = "force"); otherwise Sphinx would skip chapters whose
    .ipynb did not change even though the package code they run did.

The build needs no network: the theme's assets ship in the wheel, and notebooks are executed by a
local kernel. (Pages with ipywidgets reference require.js and the widget manager on a CDN; the
reader's browser loads those at view time.)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parent.parent
BOOK_DIR = REPO_DIR / "book"
OUT_DIR = BOOK_DIR / "_build" / "html"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--no-fresh",
        action="store_true",
        help="reuse the previous Sphinx environment (only changed chapters are re-executed)",
    )
    parser.add_argument("sphinx_args", nargs="*", help="extra arguments for sphinx-build (after --)")
    args = parser.parse_args(argv)

    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-T"]
    if not args.no_fresh:
        cmd.append("-E")
    cmd += ["-b", "html", *args.sphinx_args, str(BOOK_DIR), str(OUT_DIR)]

    print("+", " ".join(cmd), flush=True)
    start = time.perf_counter()
    rc = subprocess.call(cmd, cwd=REPO_DIR, env=os.environ.copy())
    elapsed = time.perf_counter() - start

    if rc == 0:
        print(f"\nBook built in {elapsed:.1f} s: {OUT_DIR / 'index.html'}")
    else:
        print(f"\nBook build FAILED (exit {rc}) after {elapsed:.1f} s", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
