"""python -m blink_edu.bench.slo: a tiny simulated sweep writes valid results; a tiny real-engine
run adds its measurement and the simulator's error to the same file, keeping the sweep."""

from __future__ import annotations

import json

import pytest

from blink_edu.backend import get_backend
from blink_edu.bench import slo
from blink_edu.sched import POLICIES


def test_tiny_sim_sweep_writes_results(tmp_path, capsys):
    rc = slo.main(["--sim", "--rates", "1,6", "--num-requests", "24", "--out", str(tmp_path),
                   "--no-progress"])
    assert rc == 0
    data = json.loads((tmp_path / "slo.json").read_text())
    assert data["name"] == "slo" and data["config"]["mode"] == "sim"
    assert set(data["raw"]["sim"]) == set(POLICIES)
    for by_rate in data["raw"]["sim"].values():
        assert set(by_rate) == {"1.0", "6.0"}
        for s in by_rate.values():
            assert 0 <= s["ttft_attainment_pct"] <= 100 and 0 <= s["tbt_attainment_pct"] <= 100
    summary = data["summary"]
    for key in ("lvf_minus_fcfs_ttft_attainment_pts", "lvf_minus_fcfs_tbt_attainment_pts",
                "sim_vs_real_error", "headline_rate"):
        assert key in summary
    assert summary["sim_vs_real_error"] is None
    rate = summary["headline_rate"]
    if rate is not None:
        raw = data["raw"]["sim"]
        want = raw["lvf"][str(rate)]["ttft_attainment_pct"] - raw["fcfs"][str(rate)]["ttft_attainment_pct"]
        assert abs(summary["lvf_minus_fcfs_ttft_attainment_pts"] - want) < 1e-9
    assert (tmp_path / "slo_attainment.png").stat().st_size > 0
    assert "ttft_attainment_pct" in capsys.readouterr().out


def test_tiny_real_run_is_added_beside_the_sweep(tmp_path, capsys):
    assert slo.main(["--sim", "--rates", "1", "--num-requests", "8", "--out", str(tmp_path),
                     "--no-progress", "--no-plot"]) == 0
    path = tmp_path / "slo.json"
    stale = json.loads(path.read_text())
    stale["summary"]["sim_vs_real_gone"] = 1.0  # a real-part key an older --real wrote
    path.write_text(json.dumps(stale))
    # --kv-blocks 32: a request of the longest (512 tokens) needs 32 blocks of 16; --hog: LVF
    # again beside a CPU hog on every core but this one
    assert slo.main(["--real", "--rates", "30", "--num-requests", "5", "--kv-blocks", "32",
                     "--calibration-requests", "4", "--policies", "fcfs,lvf,waiting-first",
                     "--hog", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "slo.json").read_text())
    assert set(data["raw"]) == {"sim", "real", "real_executors"}  # the sweep is kept
    rows = data["raw"]["real_executors"]["reference"]
    assert set(rows["quiet"]) == {"fcfs", "lvf", "waiting-first"} and set(rows["hog"]) == {"lvf"}
    assert rows["quiet"]["lvf"]["30.0"] == data["raw"]["real"]["lvf"]["30.0"]["real"]
    hog = rows["hog"]["lvf"]["30.0"]
    assert hog["tokens"] == rows["quiet"]["lvf"]["30.0"]["tokens"] > 0  # the same work
    summary = data["summary"]
    assert summary["reference_lvf_hog_ttft_loss_pts"] == (
        rows["quiet"]["lvf"]["30.0"]["ttft_attainment_pct"] - hog["ttft_attainment_pct"])
    assert summary["host_cpu_us_per_token_reference"] > 0
    cores = data["config"]["real"]["cores"]
    assert cores["frontend"] not in cores["others"]
    assert "headline_rate" in data["summary"] and "sim_vs_real_gone" not in data["summary"]
    for policy in ("fcfs", "lvf"):
        run = data["raw"]["real"][policy]["30.0"]
        for side in ("real", "sim"):
            assert 0 <= run[side]["ttft_attainment_pct"] <= 100
            assert run[side]["median_tpot_ms"] > 0
        assert run["real"]["mean_iteration_ms"] > 0 and run["real"]["mean_iteration_model_ms"] > 0
    error = data["summary"]["sim_vs_real_error"]
    assert isinstance(error, float) and error >= 0
    assert data["summary"]["iteration_model_error"] >= 0
    gaps = data["summary"]["real_lvf_minus_fcfs_by_rate"]["30.0"]
    assert gaps["ttft_attainment_pts"] == data["summary"]["real_lvf_minus_fcfs_ttft_attainment_pts"]
    assert isinstance(data["summary"]["real_rates_meeting_target"], list)
    real = data["config"]["real"]
    assert real["preset"]["ttft_slo_s"] > 0
    # --transfer-budget auto: the simulator tried every candidate B_xfer at the given rate and
    # the engine ran with one of them
    tried = {p["budget"] for p in real["plan_predictions"]}
    assert tried == {4, 8, 16, 19}  # powers of two below the paper's, scaled: 32 x 2400 / 4005
    assert real["rotasched"]["transfer_budget_blocks"] in tried
    # --decision-interval auto: and every candidate interval with each budget
    assert {p["interval"] for p in real["plan_predictions"]} == {1, 2, 4, 8, 16}
    assert len(real["plan_predictions"]) == 4 * 5
    assert real["rotasched"]["decision_interval"] in {1, 2, 4, 8, 16}
    assert "decision_interval" in real["preset"]["sources"]
    # each RotaSched policy's decisions are priced apart
    assert "lvf " in real["preset"]["sources"]["step_time"]
    assert "waiting-first " in real["preset"]["sources"]["step_time"]
    assert real["preset"]["transfer_budget_blocks"] == real["rotasched"]["transfer_budget_blocks"]
    assert "sim_vs_real_error" in capsys.readouterr().out
    # a sweep run afterwards keeps the real-engine part
    assert slo.main(["--sim", "--rates", "1", "--num-requests", "8", "--out", str(tmp_path),
                     "--no-progress", "--no-plot"]) == 0
    again = json.loads((tmp_path / "slo.json").read_text())
    assert again["summary"]["sim_vs_real_error"] == error and "real_rate" in again["summary"]
    assert "host_cpu_us_per_token_reference" in again["summary"]
    assert again["raw"]["real_executors"] == data["raw"]["real_executors"]


def test_unknown_policy_is_refused(capsys):
    with pytest.raises(SystemExit):
        slo.main(["--sim", "--policies", "lvf,nope"])
    assert "unknown policy" in capsys.readouterr().err


def test_non_positive_rates_are_refused(capsys):
    import pytest

    with pytest.raises(SystemExit):
        slo.main(["--sim", "--rates", "2,0"])
    assert "rates must be positive" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--real", "--kv-blocks", "8"], "longest request needs 32 blocks"),
    (["--real", "--calibration-requests", "0"], "must be >= 1"),
    (["--sim", "--num-requests", "x"], "expected an integer"),
    (["--real", "--transfer-budget", "0"], "must be >= 1"),
    (["--sim", "--transfer-budget", "8"], "--transfer-budget is for --real"),
    (["--real", "--decision-interval", "0"], "must be >= 1"),
    (["--sim", "--decision-interval", "4"], "--decision-interval is for --real"),
    (["--sim", "--hog"], "--hog is for --real"),
    (["--real", "--executor", "graph,eager"], "one host-driven executor at most"),
    pytest.param(["--real", "--executor", "persistent"], "needs a GPU",
                 marks=pytest.mark.skipif(not get_backend().is_simulator,
                                          reason="on a GPU it would run the experiment")),
])
def test_bad_arguments_are_refused_before_any_work(capsys, args, message):
    with pytest.raises(SystemExit):
        slo.main(args)
    assert message in capsys.readouterr().err


def test_the_plan_measures_where_the_target_has_the_widest_margin_or_the_nearest_miss():
    from blink_edu.bench.slo_plan import nearest_to_target

    def p(budget, interval, ttft, tbt, fcfs=80.0):
        return {"budget": budget, "interval": interval, "rate": 1.0, "ttft_pts": ttft,
                "tbt_pts": tbt, "fcfs_ttft_pct": fcfs}

    met = [p(8, 1, 60, -4), p(16, 4, 40, 0), p(32, 8, 70, -20), p(58, 1, 90, 0, fcfs=100)]
    assert nearest_to_target(met) == met[1]  # margins 1, 10, -25; the last: FCFS met TTFT
    missed = [p(8, 1, 9, -2), p(16, 4, 25, -30), p(32, 8, 12, -1)]
    assert nearest_to_target(missed) == missed[2]  # margins -21, -25, -18
    tie = [p(8, 4, 35, 0), p(8, 2, 35, 0)]
    assert nearest_to_target(tie)["interval"] == 2


def test_a_hog_on_a_one_core_machine_is_refused_before_any_work(capsys, monkeypatch):
    from blink_edu.bench import hog

    monkeypatch.setattr(hog.os, "sched_getaffinity", lambda pid: {0})
    with pytest.raises(SystemExit):
        slo.main(["--real", "--hog"])
    assert "at least two cores" in capsys.readouterr().err
