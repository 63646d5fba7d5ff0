"""Which model to run when none is named: the project's own, bundled in the repository's ``data/``.

``data/README.md`` is its model card. Resolution order: an explicit folder, then the
``BLINK_EDU_MODEL`` environment variable, then ``data/`` beside the package (a source checkout,
including ``pip install -e .``). The result must be a Hugging Face model folder.
"""

from __future__ import annotations

import os
from pathlib import Path

MODEL_ENV = "BLINK_EDU_MODEL"
BUNDLED_DIR = Path(__file__).resolve().parents[2] / "data"


def resolve_model_dir(folder: str | os.PathLike | None = None) -> Path:
    """The model folder to use; a clear FileNotFoundError when there is none."""
    chosen = folder or os.environ.get(MODEL_ENV) or BUNDLED_DIR
    path = Path(chosen).expanduser()
    if not (path / "config.json").is_file():
        how = ("the folder you named" if folder else f"the folder named by ${MODEL_ENV}"
               if os.environ.get(MODEL_ENV) else
               "the bundled model's folder (it lives in a source checkout: pip install -e .)")
        raise FileNotFoundError(f"{path}: not a Hugging Face model folder (no config.json); "
                                f"this is {how}")
    return path
