"""Rebuild ``training_log.jsonl`` from ``train_model.py``'s console log.

The shipped model's H200 run returned its console log but not its JSON-lines log (the device tool
brings back at most 8 files; see tools/README.md). The console log carries the same figures, one
line per logged step and per held-out evaluation; this turns it into the JSON-lines form that
``train_model.py`` writes, so chapter 00 reads one format:

    python tools/console_log_to_jsonl.py data/train.log data/training_log.jsonl
"""

from __future__ import annotations

import json
import re
import sys

STEP = re.compile(r"\[train\s+([\d.]+)s\] step\s+(\d+)/\d+ ep\s+([\d.]+) loss ([\d.]+) lr ([\d.e+-]+) ([\d.]+) Mtok/s")
HELDOUT = re.compile(r"\[train\s+([\d.]+)s\] held-out loss ([\d.]+) at step (\d+)")
TOKENS_PER_STEP = re.compile(r"= ([\d,]+) tokens; ")


def convert(lines):
    tokens_per_step = None
    for line in lines:
        if tokens_per_step is None and (m := TOKENS_PER_STEP.search(line)):
            tokens_per_step = int(m.group(1).replace(",", ""))
        if m := STEP.search(line):
            elapsed, step, epoch, loss, lr, mtok = m.groups()
            yield {"step": int(step), "tokens": int(step) * (tokens_per_step or 0),
                   "epoch": float(epoch), "train_loss": float(loss), "lr": float(lr),
                   "elapsed_s": float(elapsed), "tok_per_s": round(float(mtok) * 1e6)}
        elif m := HELDOUT.search(line):
            elapsed, loss, step = m.groups()
            yield {"step": int(step), "heldout_loss": float(loss), "elapsed_s": float(elapsed)}


def main(argv=None) -> int:
    src, dst = (argv or sys.argv[1:])[:2]
    with open(src) as f, open(dst, "w") as out:
        for record in convert(f):
            out.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
