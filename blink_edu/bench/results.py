"""Writing a benchmark's results file: the machine, the commit, every figure, and a summary."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parents[2] / "bench" / "results"


def commit() -> str:
    """The commit being measured: $BLINK_EDU_COMMIT (set where no .git travels), else git's."""
    if os.environ.get("BLINK_EDU_COMMIT"):
        return os.environ["BLINK_EDU_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=RESULTS_DIR.parent.parent, timeout=10)
        return out.stdout.strip() or "unknown"
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


def write_results(name: str, config: dict, raw: dict, summary: dict, out_dir: Path | None = None) -> Path:
    out_dir = Path(out_dir or os.environ.get("BLINK_EDU_RESULTS_DIR") or RESULTS_DIR)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    payload = {"name": name, "when": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
               "commit": commit(), "machine": machine(), "config": config, "summary": summary,
               "raw": raw}
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
