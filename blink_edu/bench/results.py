"""Writing a benchmark's results file: the machine, the commit, every figure, and a summary.

docs/design.md §9. A benchmark writes ``<out>/<name>.json``. ``out`` is a scratch folder
(``./bench_scratch``, ignored by git) unless the run asks for another with ``--out`` (or
``$BLINK_EDU_RESULTS_DIR``): publishing into the checkout's ``bench/results/`` -- the figures the
chapters read, measured on the GPU machine -- is always a deliberate ``--out bench/results``.

A file may hold sections measured apart (``bench.slo``: the simulator's sweep and the real
engine's run). Each section keeps its own provenance (when, commit, machine) under
``sections``; the top-level ``when``/``commit``/``machine`` say who wrote the file last. A run
that rewrites one section carries the other sections' provenance over unchanged, so a merge
never relabels data measured elsewhere.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
from pathlib import Path

from ..config import PUBLISHED_RESULTS_DIR

#: Where a benchmark writes unless told otherwise (relative to the working directory).
SCRATCH_DIR = Path("bench_scratch")
#: The checkout's published results, read by the chapters (re-exported for them).
RESULTS_DIR = PUBLISHED_RESULTS_DIR


def results_dir(out: str | Path | None = None) -> Path:
    """The folder a run writes to: ``out``, else ``$BLINK_EDU_RESULTS_DIR``, else the scratch
    folder. Never the published results unless one of those names them."""
    return Path(out or os.environ.get("BLINK_EDU_RESULTS_DIR") or SCRATCH_DIR)


def commit() -> str:
    """The commit being measured: $BLINK_EDU_COMMIT (set where no .git travels, or where the .git
    that travels is not the tree's: a copied working tree), else git's HEAD, with "-dirty" when
    the tracked files differ from it — a result measured on uncommitted code says so."""
    if os.environ.get("BLINK_EDU_COMMIT"):
        return os.environ["BLINK_EDU_COMMIT"]
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=here, timeout=10).stdout.strip()
        if not head:
            return "unknown"
        changed = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=here, timeout=30)
        return head + ("-dirty" if changed.returncode == 1 else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def machine() -> dict:
    from ..backend import get_backend

    info = {"cpu_count": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "backend": get_backend().name,
            "device": get_backend().device_name}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        info["nvidia_smi"] = out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    for package in ("numpy", "numba", "numba_cuda", "cupy", "torch", "transformers"):
        try:
            module = __import__(package)
            info[package] = getattr(module, "__version__", "?")
        except Exception:  # noqa: BLE001 - a missing optional package is just not listed
            pass
    return info


def provenance() -> dict:
    """This run's ``when``, ``commit`` and ``machine``."""
    return {"when": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "commit": commit(), "machine": machine()}


def read_results(name: str, out_dir: str | Path | None = None) -> dict:
    """The results file ``name`` in ``out_dir`` (``results_dir``'s rule), or {} if none."""
    path = results_dir(out_dir) / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def section_provenance(previous: dict, section: str) -> dict:
    """Who measured ``section`` of an earlier file: its own record, or (a file written before
    sections were recorded) the file's top-level one."""
    recorded = previous.get("sections", {}).get(section)
    if recorded:
        return recorded
    return {k: previous.get(k) for k in ("when", "commit", "machine")}


def write_results(name: str, config: dict, raw: dict, summary: dict,
                  out_dir: str | Path | None = None, sections: dict | None = None) -> Path:
    """Write ``<out_dir>/<name>.json`` (``results_dir``'s rule). ``sections``: the provenance
    of each section of ``raw`` (``{"sim": provenance(), "real": section_provenance(old, ...)}``)
    when the file holds parts measured apart."""
    out = results_dir(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    payload = {"name": name, **provenance(), "config": config, "summary": summary, "raw": raw}
    if sections:
        payload["sections"] = sections
    path.write_text(json.dumps(payload, indent=2, default=float) + "\n")
    return path


def print_table(rows: list[dict], columns: list[str]) -> None:
    widths = {c: max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).ljust(widths[c]) for c in columns))


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "-" if v is None else str(v)
