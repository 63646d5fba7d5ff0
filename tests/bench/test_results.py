"""Where benchmarks write: a scratch folder unless --out names another, never the published
bench/results/ by default; and a merge into a results file never relabels a section measured
elsewhere (each section keeps its own machine and commit)."""

from __future__ import annotations

import hashlib
import json

from blink_edu.bench import results, slo


def digest_of(folder) -> dict:
    """{file name: sha256} of every file in ``folder``."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())
            if p.is_file()}


def test_by_default_a_benchmark_writes_to_scratch_and_leaves_bench_results_alone(
        tmp_path, monkeypatch):
    published = digest_of(results.RESULTS_DIR)
    monkeypatch.delenv("BLINK_EDU_RESULTS_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert slo.main(["--sim", "--rates", "1", "--num-requests", "6", "--no-progress",
                     "--no-plot"]) == 0
    written = tmp_path / results.SCRATCH_DIR / "slo.json"
    assert json.loads(written.read_text())["config"]["mode"] == "sim"
    assert digest_of(results.RESULTS_DIR) == published
    assert results.results_dir(None) == results.SCRATCH_DIR
    assert results.results_dir("elsewhere").name == "elsewhere"


def test_a_sim_merge_keeps_the_real_sections_machine_and_commit(tmp_path, monkeypatch):
    monkeypatch.setenv("BLINK_EDU_COMMIT", "c0ffee-this-run")
    elsewhere = {"gpu": "NVIDIA H200", "backend": "gpu"}
    # a file written by an earlier --real run on another machine, before sections were recorded
    (tmp_path / "slo.json").write_text(json.dumps({
        "name": "slo", "when": "2026-01-01T00:00:00+00:00", "commit": "805c8a5-measured",
        "machine": elsewhere, "config": {"real": {"kv_blocks": 384}},
        "summary": {"sim_vs_real_error": 0.088, "real_rate": 138.1},
        "raw": {"real": {"lvf": {"138.1": {"real": {}, "sim": {}}}}}}))
    assert slo.main(["--sim", "--rates", "1", "--num-requests", "6", "--out", str(tmp_path),
                     "--no-progress", "--no-plot"]) == 0
    data = json.loads((tmp_path / "slo.json").read_text())
    real, sim = data["sections"]["real"], data["sections"]["sim"]
    assert real["machine"] == elsewhere and real["commit"] == "805c8a5-measured"
    assert real["when"] == "2026-01-01T00:00:00+00:00"
    assert sim["commit"] == "c0ffee-this-run" and sim["machine"] != elsewhere
    assert data["raw"]["real"] == {"lvf": {"138.1": {"real": {}, "sim": {}}}}
    assert data["summary"]["sim_vs_real_error"] == 0.088
    # and once more: the recorded section provenance is carried, not re-read from the top
    monkeypatch.setenv("BLINK_EDU_COMMIT", "beef-next-run")
    assert slo.main(["--sim", "--rates", "1", "--num-requests", "6", "--out", str(tmp_path),
                     "--no-progress", "--no-plot"]) == 0
    again = json.loads((tmp_path / "slo.json").read_text())
    assert again["sections"]["real"] == real
    assert again["sections"]["sim"]["commit"] == again["commit"] == "beef-next-run"


def test_the_commit_says_when_the_tree_differs_from_it(monkeypatch):
    import subprocess
    from types import SimpleNamespace

    from blink_edu.bench import results

    monkeypatch.delenv("BLINK_EDU_COMMIT", raising=False)
    calls = []

    def fake_run(args, **kwargs):
        calls.append(args[:2])
        if args[1] == "rev-parse":
            return SimpleNamespace(stdout="abc1234\n", returncode=0)
        return SimpleNamespace(stdout="", returncode=diff_rc)

    monkeypatch.setattr(subprocess, "run", fake_run)
    diff_rc = 1  # git diff --quiet HEAD: the tracked files differ
    assert results.commit() == "abc1234-dirty"
    diff_rc = 0
    assert results.commit() == "abc1234"
    monkeypatch.setenv("BLINK_EDU_COMMIT", "7750320")
    assert results.commit() == "7750320"
    assert calls == [["git", "rev-parse"], ["git", "diff"]] * 2
