"""``python -m blink_edu.bench.kv_transfer``: refuses a GPU-less run with a clear message, and its
``--tiny`` smoke mode runs every section and writes the summary the chapter reads."""

from __future__ import annotations

import json

import pytest

from blink_edu.backend import get_backend
from blink_edu.bench import kv_transfer


@pytest.mark.skipif(not get_backend().is_simulator, reason="on a GPU the full benchmark would run")
def test_without_a_gpu_it_says_so_and_fails(capsys):
    assert kv_transfer.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_tiny_run_writes_every_figure(tmp_path, monkeypatch):
    monkeypatch.setenv("BLINK_EDU_RESULTS_DIR", str(tmp_path))
    assert kv_transfer.main(["--tiny", "--repeats", "1"]) == 0
    result = json.loads((tmp_path / "kv_transfer.json").read_text())
    summary = result["summary"]
    for key in ("naive_gbps", "batched_gbps", "duplex_total_gbps", "link_peak_gbps",
                "batched_fraction_of_peak", "naive_over_duplex_time"):
        assert summary[key] > 0, key
    assert summary["paper"]["naive_gbps"] == 10.0
    assert summary["rotate_out_blocks_eager"] == 1  # the dirty tail
    assert summary["rotate_out_blocks_no_eager"] == result["raw"]["rotate_out"][1]["blocks_total"]
    variants = {row["variant"] for row in result["raw"]["ladder"] if "gbps" in row}
    assert {"naive", "naive_layer", "merged", "batched", "duplex"} <= variants
    # the CPU has no mapped transport: its rows say why instead of a figure; the staged ticket's
    # host time is measured
    mapped = [row for row in result["raw"]["ladder"] if row["variant"].startswith("mapped")]
    assert mapped and all("GPU" in row["error"] for row in mapped)
    staged = [row for row in result["raw"]["ticket_issue"] if row["transport"] == "staged"]
    assert [row["blocks"] for row in staged] == [1, 16, 16] and all(r["issue_us"] > 0 for r in staged)
    sizes = [row["size"] for row in result["raw"]["size_sweep"]]
    assert sizes[0] == 4096 and sizes == sorted(sizes)
