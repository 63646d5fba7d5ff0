"""Sphinx configuration for the blink_edu book.

The book is built OFFLINE from the chapters in ``notebooks/`` with Sphinx + MyST-NB +
sphinx-book-theme (all from PyPI). Build it with ``python tools/build_book.py``.

How chapters get into the book without copying them by hand
-----------------------------------------------------------
At configuration time this file makes ``book/chapters`` a symbolic link to ``../notebooks``
(a generated path, ignored by git). ``index.md`` lists ``chapters/*`` with a glob toctree, and
``exclude_patterns`` below keeps only top-level ``NN_*.ipynb`` chapters (not ``labs/``, handouts
or checkpoints).

Why a link to the whole folder rather than one link or copy per notebook: MyST-NB runs each
notebook with its working directory set to the document's folder. ``book/chapters`` is a link,
so the kernel's real working directory is ``notebooks/`` itself, exactly as when a student runs
the chapter in Jupyter or ``tests/test_notebooks.py`` runs it. Relative paths such as
``../data`` therefore mean the same thing everywhere.

If the platform cannot make symlinks, we fall back to copying the chapters; then relative paths
inside chapters would resolve from ``book/chapters`` instead (chapters should locate bundled
files through the package, not through relative paths, so this should not matter).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

BOOK_DIR = Path(__file__).resolve().parent
REPO_DIR = BOOK_DIR.parent
NOTEBOOKS_DIR = REPO_DIR / "notebooks"
CHAPTERS_LINK = BOOK_DIR / "chapters"
CHAPTER_GLOB = "[0-9][0-9]_*.ipynb"


def _link_chapters() -> None:
    """Make ``book/chapters`` point at ``notebooks/`` (symlink, or a fresh copy as fallback)."""
    target = os.path.relpath(NOTEBOOKS_DIR, BOOK_DIR)  # "../notebooks"
    if CHAPTERS_LINK.is_symlink():
        if os.readlink(CHAPTERS_LINK) == target:
            return
        CHAPTERS_LINK.unlink()
    elif CHAPTERS_LINK.is_dir():
        # A previous copy-fallback build (or a stale folder): it is generated, replace it.
        shutil.rmtree(CHAPTERS_LINK)
    elif CHAPTERS_LINK.exists():
        CHAPTERS_LINK.unlink()
    try:
        CHAPTERS_LINK.symlink_to(target, target_is_directory=True)
    except OSError:
        CHAPTERS_LINK.mkdir()
        for nb in sorted(NOTEBOOKS_DIR.glob(CHAPTER_GLOB)):
            shutil.copy2(nb, CHAPTERS_LINK / nb.name)


_link_chapters()

# -- Project information -------------------------------------------------------------------

project = "blink_edu"
author = "the blink_edu authors"
copyright = "the blink_edu authors; Apache-2.0"
language = "en"

# -- General configuration -----------------------------------------------------------------

extensions = [
    "myst_nb",  # parses .md (MyST) and .ipynb, executes notebooks; brings myst_parser with it
]

# Only the top-level chapters NN_*.ipynb of notebooks/ are part of the book. Everything else
# reachable through the chapters link (labs, handouts, scratch notebooks, checkpoints, data
# files) is excluded, so Sphinx neither executes it nor warns that it is in no toctree.
exclude_patterns = [
    "_build",
    "jupyter_execute",
    "**/.ipynb_checkpoints",
    "Thumbs.db",
    ".DS_Store",
    "chapters/*/**",  # sub-folders of notebooks/ (labs/, labs/handout/, ...)
    "chapters/[!0-9]*",  # top-level files that are not numbered chapters
    "chapters/[0-9][!0-9]*",
    "chapters/[0-9][0-9][!_]*",
]

myst_enable_extensions = [
    "colon_fence",
    "deflist",
    "dollarmath",
    "amsmath",
]
myst_heading_anchors = 3

# -- MyST-NB: execution ----------------------------------------------------------------------

# Every chapter is executed on every build: the book shows what the code does today.
nb_execution_mode = "force"
nb_execution_raise_on_error = True  # a failing cell fails the build
nb_execution_allow_errors = False
nb_execution_timeout = 900  # seconds per cell; the CUDA simulator is slow on a 2-core CPU
nb_execution_show_tb = True
nb_execution_in_temp = False  # run in the chapter's own folder (= notebooks/, see above)
# Whatever kernel name a chapter was saved with (".venv", "blink_edu", "Python 3 (ipykernel)"),
# run it with the python3 kernel of the interpreter running the build.
nb_kernel_rgx_aliases = {".*": "python3"}

# -- MyST-NB: rendering ----------------------------------------------------------------------

# Matplotlib's inline backend emits image/png (+ text/plain): a static image that needs no JS
# and no network. MyST-NB's default MIME priorities pick the PNG.
nb_merge_streams = True  # one stdout block per cell instead of many fragments

# ipywidgets: MyST-NB writes the widget state captured during execution into the page and,
# only on pages that contain widgets, adds <script> tags for require.js and the
# @jupyter-widgets/html-manager embed bundle (CDN URLs, myst_nb's default ``nb_ipywidgets_js``).
# Those are loaded by the reader's browser at view time; the build itself fetches nothing.
# Offline readers still see each widget's static text fallback.

# -- HTML output ---------------------------------------------------------------------------

html_theme = "sphinx_book_theme"
html_title = "blink_edu"
html_theme_options = {
    # Offline-safe: no launch buttons (Binder/Colab/JupyterHub), no repository links, no
    # analytics; nothing in the page points to a service the build would have to reach.
    "launch_buttons": {},
    "use_repository_button": False,
    "use_issues_button": False,
    "use_source_button": False,
    "use_download_button": True,  # download .ipynb / .md: a local file
    "use_fullscreen_button": True,
    "show_toc_level": 2,
    "home_page_in_toc": True,
    "navigation_with_keys": False,
}
html_static_path: list[str] = []
html_last_updated_fmt = None
html_copy_source = True

# -- Warnings ------------------------------------------------------------------------------

# The build runs with -W (warnings are errors). Nothing is suppressed at the moment; if a
# third-party warning ever becomes unavoidable, suppress that one subtype here and say why.
suppress_warnings: list[str] = []
