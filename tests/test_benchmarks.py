"""wmrl-bench: every experiment on a minimal budget writes consistent outputs; config plumbing."""

import json

import pytest
from sandbox_helpers import local_executor  # noqa: F401

from benchmarks.__main__ import main
from benchmarks.ablation import AblationConfig
from benchmarks.common import load_config
from benchmarks.speedup import SpeedupConfig, _finished_arm
from wmrl_envs.config_cli import build_config

pytest.importorskip("transformers")


def _read(run_dir):
    result = json.loads((run_dir / "results.json").read_text())
    markdown = (run_dir / "results.md").read_text()
    config = json.loads((run_dir / "config.json").read_text())
    return result, markdown, config


def test_speedup_budget_matched_run_is_internally_consistent(tmp_path, capsys):
    run_dir = tmp_path / "speedup"
    rc = main(
        ["speedup", "--config", "speedup-smoke", "--run-dir", str(run_dir), "--no-progress", "--monitor-max-gap", "0.0",
         "--shadow-every", "2"]
    )  # fmt: skip
    assert rc == 0
    result, markdown, config = _read(run_dir)
    out = capsys.readouterr().out
    assert "heldout_vs_cost.png" in out and "monitor.png" in out and "results.json" in out
    assert (run_dir / "heldout_vs_cost.png").stat().st_size > 0 and (run_dir / "monitor.png").stat().st_size > 0
    assert config["policy"] == "tiny-plan" and config["budget_cpu_s"] == 20.0

    arms = {r["arm"]: r for r in result["per_seed"]}
    assert set(arms) == {"real", "real1", "wm", "wmrl"}
    # per-step histories live gzipped beside the arms, not in results.json
    assert "histories" not in result and result["histories_in"] == "arms/<arm>-seed<seed>.json.gz"
    histories = {f"{a}-seed0": _finished_arm(run_dir / "arms", a, 0)["history"] for a in arms}
    # The world model is out of sample by construction, and the summary says so.
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["wm_fit_overlap"] == [] and summary["wm_fit_tasks"] and summary["seeds"] == [0]
    assert not set(summary["wm_fit_tasks"]) & set(result["train_tasks"] + result["eval_tasks"])
    assert summary["wm_one_off_cost"]["fit_cpu_s"] > 0 and summary["wm_one_off_cost"]["fit_logged_cpu_s"] > 0
    for arm in ("real", "real1", "wm", "wmrl"):
        a = summary["arms"][arm]
        assert a["distinct_scripts_per_task"] >= 1 and a["cache_hits"] >= 0 and a["steps"] >= 1
        assert (arm == "real") != ("reach_ratio_final" in a)
        assert (arm == "wmrl") == ("reach_vs_wm_ratio_final" in a) == ("anchor_cpu_share_ci95" in a)
    assert arms["real1"]["steps"] > arms["real"]["steps"]  # one group per step: more, cheaper steps
    for arm, row in arms.items():
        assert f"| {arm} |" in markdown
        curve = result["curves"][f"{arm}-seed0"]
        # Every arm spends its budget (stopping at the first step boundary past it) and is
        # evaluated at the start (shared) and at the end; evaluation is not part of the cost.
        assert row["cost_cpu_s"] >= 20.0 and row["steps"] == len(histories[f"{arm}-seed0"]) >= 1
        assert [p["fraction"] for p in curve] == [0.0, 1.0] and curve[-1]["cost_cpu_s"] == pytest.approx(
            row["cost_cpu_s"], rel=0.05
        )
        assert curve[0] == result["curves"]["real-seed0"][0]  # same initial weights: one start point
        parts = sum(
            row[k] for k in ("gen_cpu_s", "real_grading_cpu_s", "wm_grading_cpu_s", "update_cpu_s", "other_cpu_s")
        )
        assert 0 < parts <= row["cost_cpu_s"] * 1.05 + 1.0  # components are part of the measured total
        assert len(row["cpu_probe_s"]) == 2 and min(row["cpu_probe_s"]) > 0  # the machine's speed, outside the budget
    # Shadow probes of the world-model arms: executed for real outside the budget and the arm's cache.
    for arm in ("wm", "wmrl"):
        shadow = arms[arm]["shadow"]
        # every second step that had world-model-only gradings (a step of malformed replies has none)
        assert {r["step"] for r in shadow["records"]} <= set(range(2, arms[arm]["steps"] + 1, 2))
        assert shadow["summary"]["executions"] == sum(r["n"] for r in shadow["records"])
        assert "raw_gap_end" in summary["arms"][arm]["shadow"]
    assert "shadow" not in arms["real"] and "shadow" not in summary["arms"]["real"]
    assert (run_dir / "shadow_gap.png").stat().st_size > 0
    # The raw world-model arm never executes; WMRL executes only its anchor groups.
    assert arms["wm"]["real_executions"] == 0 and arms["real"]["real_executions"] > 0
    assert arms["wm"]["cache_runs"] == 0 and arms["real"]["cache_runs"] + arms["real"]["cache_hits"] > 0
    wmrl_groups = arms["wmrl"]["steps"] * 2
    assert 0.0 <= arms["wmrl"]["anchor_cpu_share"] < 1.0 and arms["real"]["anchor_cpu_share"] is None
    assert arms["wmrl"]["anchor_weight_trajectory"][0][0] == 1 and arms["wmrl"]["anchor_weight_mean"] >= 1.0
    assert arms["wmrl"]["real_executions"] <= round(arms["wmrl"]["anchor_share"] * wmrl_groups) * 2
    # The headline is derived from the same curves; an undefined ratio says why.
    [head] = result["headline"]
    assert head["reach_ratio"] is not None or head["note"]
    assert head["ideal_ratio"] is None or head["ideal_ratio"] > 0
    assert "cost-to-reach ratio" in markdown and "ideal ratio" in markdown and "CPU probe" in markdown
    # max_gap 0 with action "raise": a positive gap, smoothed over the guard's window (4 steps
    # with anchor groups), raises the fraction; the first such step alone decides the first window.
    events = result["guard_events"]["wmrl-seed0"]
    gaps = [h["monitor/gap"] for h in histories["wmrl-seed0"] if h.get("monitor/gap") is not None]
    if events:
        assert any(g > 0 for g in gaps) and all("exceed real scores" in e["reason"] for e in events)
    if gaps and gaps[0] > 0:
        assert events
    # A rerun into the same directory continues from the saved arms: nothing is trained again.
    args = ["--config", "speedup-smoke", "--run-dir", str(run_dir), "--no-progress", "--monitor-max-gap", "0.0",
            "--shadow-every", "2"]  # fmt: skip
    assert main(["speedup", *args]) == 0
    again, _, _ = _read(run_dir)
    assert again["per_seed"] == result["per_seed"] and again["curves"] == result["curves"]
    # From the saved arms: a finished run's summary is re-derived as the run wrote it ...
    from benchmarks.speedup import summary_from_arms

    (run_dir / "summary.json").unlink()
    assert summary_from_arms(run_dir)["seeds"] == [0]
    assert json.loads((run_dir / "summary.json").read_text()) == summary
    assert not (run_dir / "summary-partial.json").exists()
    # ... and an unfinished one's is the same over its finished seeds, marked partial
    planned = json.loads((run_dir / "config.json").read_text())
    (run_dir / "config.json").write_text(json.dumps({**planned, "seeds": [0, 1]}))
    summary_from_arms(run_dir)
    partial = json.loads((run_dir / "summary-partial.json").read_text())
    assert partial.pop("partial").startswith("PARTIAL: seeds [0] of the planned [0, 1]") and partial == summary
    assert (run_dir / "heldout_vs_cost-partial.png").stat().st_size > 0
    (run_dir / "arms" / "wm-seed0.json.gz").unlink()  # a seed with an arm missing does not count
    with pytest.raises(FileNotFoundError, match="no seed"):
        summary_from_arms(run_dir)
    # The run above trained its arms side by side (workers = 2, the default); a rerun in one
    # process trains only the missing arm, from the same start, and keeps the others.
    assert config["workers"] == 2
    assert main(["speedup", *args, "--workers", "1"]) == 0
    resumed, _, _ = _read(run_dir)
    rows = {r["arm"]: r for r in resumed["per_seed"]}
    assert all(rows[a] == arms[a] for a in ("real", "real1", "wmrl")) and rows["wm"] != arms["wm"]
    assert rows["wm"]["steps"] >= 1 and resumed["curves"]["wm-seed0"][0] == result["curves"]["real-seed0"][0]


def test_anchor_fields_read_what_the_wmrl_arms_anchors_bought():
    from benchmarks.speedup import anchor_fields

    history = [
        {"step": 1, "anchor/weight": 1.0, "time/real_grading_cpu": 3.0, "monitor/anchor_groups": 1, "monitor/informative_groups": 0},
        {"step": 2, "anchor/weight": 1.0, "time/real_grading_cpu": 0.0},
        {"step": 3, "anchor/weight": 2.0, "anchor/weight_se": 0.3, "time/real_grading_cpu": 5.0, "monitor/anchor_groups": 3, "monitor/informative_groups": 3},
        {"step": 4, "anchor/weight": 1.5},
    ]  # fmt: skip
    got = anchor_fields("wmrl", history, cost_cpu_s=20.0)
    assert got["anchor_cpu_share"] == pytest.approx(8.0 / 20.0)
    assert got["informative_anchor_share"] == pytest.approx(3 / 4)
    assert got["anchor_weight_mean"] == pytest.approx(5.5 / 4)
    assert got["anchor_weight_trajectory"] == [[1, 1.0, None], [3, 2.0, 0.3], [4, 1.5, None]]
    assert set(anchor_fields("wm", history, 20.0).values()) == {None}
    assert got["uninformative_anchor_reasons"] is None  # a history from before the monitor counted why
    history[0].update(
        {"monitor/flat_true_groups": 1, "monitor/flat_calibrated_groups": 0, "monitor/single_pair_groups": 0}
    )
    why = anchor_fields("wmrl", history, cost_cpu_s=20.0)["uninformative_anchor_reasons"]
    assert why == {"flat_true": pytest.approx(1 / 4), "flat_calibrated": 0.0, "single_pair": 0.0}


def test_wm_update_plot_draws_both_models_per_refit(tmp_path):
    from benchmarks.speedup import _plot_wm_updates

    fidelity = {"status_accuracy": 0.8, "spearman_within_task": 0.5}
    history = [
        {"step": s, "initial": fidelity, "updated": {**fidelity, "status_accuracy": 0.8 + s / 100}} for s in (10, 20)
    ]
    path = _plot_wm_updates([{"arm": "wmrl", "seed": 0, "wm_updates": {"history": history}}], tmp_path / "u.png")
    assert path.stat().st_size > 0


def test_each_anchored_arm_builds_the_wmrl_stack_with_its_own_anchor_selection(monkeypatch):
    import benchmarks.speedup as speedup

    built = {}

    class Built(Exception):
        pass

    def fake_stack(env, stack, world_model, **kwargs):
        built.update(stack=stack, selection=kwargs["anchor_selection"])
        raise Built

    monkeypatch.setattr(speedup, "make_vector_env", lambda *a, **k: object())
    monkeypatch.setattr(speedup, "build_stack", fake_stack)
    config = speedup.SpeedupConfig(arms=("wmrl", "wmrl-informative"), anchor_selection="random")
    expected = {"wmrl": ("wmrl", "random"), "wmrl-informative": ("wmrl", "informative"), "real1": ("real", "random")}
    for arm, (stack, selection) in expected.items():
        with pytest.raises(Built):
            speedup._one_arm(arm, 0, None, None, object(), config, [], None, None)
        assert (built["stack"], built["selection"]) == (stack, selection), arm
    assert speedup.SpeedupConfig().arms == speedup.SPEEDUP_ARMS  # the optional arm runs only when named
    with pytest.raises(ValueError, match="wmrl-informative"):
        speedup.SpeedupConfig(arms=("wmrl-smart",))


def test_the_informative_arm_reports_anchor_metrics_and_ratios_against_real_and_wm():
    from benchmarks.speedup import SpeedupConfig, anchor_fields, build_summary

    history = [{"step": 1, "anchor/weight": 1.0, "time/real_grading_cpu": 2.0, "monitor/anchor_groups": 2,
                "monitor/informative_groups": 2, "monitor/flat_true_groups": 0, "monitor/flat_calibrated_groups": 0,
                "monitor/single_pair_groups": 0}]  # fmt: skip
    curve = [
        {"fraction": 0.0, "cost_cpu_s": 0.0, "heldout": 0.2},
        {"fraction": 1.0, "cost_cpu_s": 10.0, "heldout": 0.6},
    ]
    parts = {
        "gen_cpu_s": 6.0,
        "real_grading_cpu_s": 2.0,
        "wm_grading_cpu_s": 0.0,
        "update_cpu_s": 1.5,
        "other_cpu_s": 0.5,
    }
    rows = [
        {"arm": arm, "seed": 0, "curve": curve, "final_heldout": 0.6, "cost_cpu_s": 10.0, "steps": steps,
         **parts, **anchor_fields(arm, history, 10.0)}
        for arm, steps in (("real", 5), ("wm", 8), ("wmrl-informative", 6))
    ]  # fmt: skip
    config = SpeedupConfig(arms=("real", "wm", "wmrl-informative"), seeds=(0,))
    summary = build_summary(config, rows, {"fit_cpu_s": 4.0, "fit_logged_cpu_s": 0.0})
    arm = summary["arms"]["wmrl-informative"]
    assert arm["informative_anchor_share"] == 1.0 and arm["anchor_cpu_share"] == pytest.approx(0.2)
    assert "reach_ratio_final" in arm and "reach_vs_wm_ratio_final" in arm
    # each seed's weight trajectory, not only its mean; arms without anchors carry none
    assert arm["anchor_weight_trajectory"] == {"0": [[1, 1.0, None]]}
    assert "anchor_weight_trajectory" not in summary["arms"]["wm"]
    # why anchor groups taught nothing, per reason over seeds (none here: both were informative)
    assert arm["uninformative_anchor_reasons"]["flat_true"] == {"mean": 0.0, "ci95": None, "seeds": 1}
    # where the budget went, and the steps a cheaper reward bought
    assert arm["cpu_share"] == pytest.approx({"gen": 0.6, "real_grading": 0.2, "wm_grading": 0.0, "update": 0.15,
                                              "other": 0.05})  # fmt: skip
    assert summary["arms"]["wm"]["steps_vs_real"] == pytest.approx(1.6) and arm["steps_vs_real"] == pytest.approx(1.2)
    assert "steps_vs_real" not in summary["arms"]["real"]
    # two world-model arm runs share the one-off cost
    assert summary["wm_one_off_cost"]["per_world_model_arm_run_cpu_s"] == pytest.approx(2.0)


def test_the_summary_says_how_much_of_each_arm_was_collapsed_off_the_format():
    from benchmarks.speedup import SpeedupConfig, _summary_table, build_summary, format_fields

    curve = [
        {"fraction": 0.0, "cost_cpu_s": 0.0, "heldout": 0.2},
        {"fraction": 1.0, "cost_cpu_s": 10.0, "heldout": 0.4},
    ]

    def row(arm, seed, malformed, rollbacks=0):
        history = [
            {"step": i + 1, "reward/malformed_rate": m, "train/rollbacks": rollbacks} for i, m in enumerate(malformed)
        ]
        return {"arm": arm, "seed": seed, "curve": curve, "final_heldout": 0.4, "cost_cpu_s": 10.0, "steps": len(malformed),
                **format_fields(history)}  # fmt: skip

    # a step counts as collapsed from 90% of its replies malformed; an arm's share is its seeds' mean
    rows = [row("real", 0, [0.0, 0.5]), row("real", 1, [0.0, 0.0]),
            row("wm", 0, [0.0, 0.9, 1.0, 1.0]), row("wm", 1, [1.0, 0.0], rollbacks=1)]  # fmt: skip
    summary = build_summary(SpeedupConfig(arms=("real", "wm"), seeds=(0, 1)), rows, {})
    assert summary["arms"]["real"]["collapsed_step_share"] == 0.0
    assert summary["arms"]["wm"]["collapsed_step_share"] == pytest.approx((0.75 + 0.5) / 2)
    assert summary["arms"]["wm"]["rollbacks"] == 0.5 and summary["arms"]["wm"]["collapsed_step_share_ci95"] is not None
    assert "collapsed steps [95% CI]" in _summary_table(summary, k=4)
    # an agent that reports no reply rates (the VLA agent) has no share, not a share of 0
    assert format_fields([{"step": 1}]) == {"collapsed_step_share": None, "rollbacks": 0}


def test_speedup_config_refuses_bad_anchor_and_calibration_settings():
    from benchmarks.speedup import SpeedupConfig

    for bad, match in (
        ({"anchor_selection": "smart"}, "anchor_selection"),
        ({"calibration_start_rule": "soon"}, "start_rule"),
        ({"monitor_action": "panic"}, "monitor_action"),
        ({"wm_update_every": -1}, "wm_update_every"),
    ):
        with pytest.raises(ValueError, match=match):
            SpeedupConfig(**bad)


def test_bootstrap_ci_covers_a_known_mean():
    import numpy as np

    from benchmarks.speedup_accounting import bootstrap_ci

    rng = np.random.default_rng(0)
    covered = 0
    for trial in range(200):
        sample = rng.normal(loc=2.0, scale=1.0, size=8)
        lo, hi = bootstrap_ci(list(sample), n_boot=2000, seed=trial)
        covered += lo <= 2.0 <= hi
        assert lo < float(sample.mean()) < hi
    # percentile bootstrap of a mean of 8 normals: ~90-93% coverage (it is known to undercover)
    assert 0.85 <= covered / 200 <= 0.99
    assert bootstrap_ci([1.0]) is None and bootstrap_ci([None, 2.0]) is None


def test_reach_ratios_use_measured_points_and_both_targets():
    from benchmarks.speedup_accounting import reach_ratios

    real = [
        {"cost_cpu_s": 0.0, "heldout": 0.2},
        {"cost_cpu_s": 50.0, "heldout": 0.5},
        {"cost_cpu_s": 100.0, "heldout": 0.6},
    ]
    other = [
        {"cost_cpu_s": 0.0, "heldout": 0.2},
        {"cost_cpu_s": 20.0, "heldout": 0.59},
        {"cost_cpu_s": 40.0, "heldout": 0.7},
    ]
    r = reach_ratios(real, other, one_off_cost=10.0)
    # final 0.6: real at 100, other first at 40 (0.59 < 0.6 at 20: no interpolation)
    assert r["ratio_final"] == pytest.approx(100 / 40) and r["ratio_final_amortized"] == pytest.approx(100 / 50)
    # 95% of the gain: 0.2 + 0.95 * 0.4 = 0.58: real first at 100 (0.5 < 0.58), other at 20
    assert r["target_95gain"] == pytest.approx(0.58) and r["ratio_95gain"] == pytest.approx(100 / 20)
    assert (
        reach_ratios(real, [{"cost_cpu_s": 0.0, "heldout": 0.2}, {"cost_cpu_s": 9.0, "heldout": 0.3}])["ratio_final"]
        is None
    )
    flat = reach_ratios([{"cost_cpu_s": 0.0, "heldout": 0.5}, {"cost_cpu_s": 9.0, "heldout": 0.4}], other)
    assert flat["ratio_final"] is None and "did not improve" in flat["note"]


def test_outcome_caches_are_per_arm_and_serve_repeats_free(local_executor):  # noqa: F811
    from benchmarks.speedup_accounting import OutcomeCache
    from wmrl_envs.sandbox import Limits

    limits = Limits(wall_seconds=20, cpu_seconds=10, memory_bytes=256 << 20)
    script = "import random\nprint(random.random())\n"
    a, b = OutcomeCache(local_executor), OutcomeCache(local_executor)
    first, again = a.run(script, limits=limits), a.run(script, limits=limits)
    assert again is first and (a.runs, a.hits) == (1, 1)
    # another arm's cache has not seen it: it executes (and pays) for itself
    other = b.run(script, limits=limits)
    assert (b.runs, b.hits) == (1, 0) and other is not first and other.stdout_tail != first.stdout_tail
    # different limits are a different run
    a.run(script, limits=Limits(wall_seconds=20, cpu_seconds=5, memory_bytes=256 << 20))
    assert a.runs == 2


def test_landmarks_are_precomputed_before_any_arm_clock(monkeypatch, tmp_path):
    """No arm pays for the tasks' landmarks: they are computed before the first arm starts."""
    import benchmarks.speedup as speedup

    calls: list[str] = []
    import wmrl_envs.autoresearch.landmarks as lm

    real = lm.task_landmarks
    monkeypatch.setattr(lm, "task_landmarks", lambda task: calls.append(task.task_id) or real(task))

    def stop(*args, **kwargs):
        raise RuntimeError("world model reached")

    monkeypatch.setattr(speedup, "_world_model", stop)
    config = SpeedupConfig(tier="small", train_tasks=("boston", "oj"), eval_tasks=("wine",), seeds=(0,))
    with pytest.raises(RuntimeError, match="world model reached"):
        speedup.run(config, tmp_path, progress=False)
    assert calls == ["boston", "oj", "wine"]


def test_out_of_sample_world_model_excludes_the_policy_tasks():
    from benchmarks.speedup_accounting import fit_out_of_sample_world_model
    from wmrl_envs.autoresearch.tasks import list_catalog

    tasks = list_catalog(None, tier="full")
    model, info = fit_out_of_sample_world_model(tasks)
    assert info["overlap"] == [] and not set(info["fit_tasks"]) & set(tasks) and model.info["n_tasks"] > 50
    assert info["fit_cpu_s"] > 0 and info["fit_logged_cpu_s"] > 0


def test_cost_to_reach_and_headline():
    from benchmarks.speedup import cost_to_reach, headline

    curve = [
        {"cost_cpu_s": 0.0, "heldout": 0.2},
        {"cost_cpu_s": 10.0, "heldout": 0.5},
        {"cost_cpu_s": 20.0, "heldout": 0.4},
    ]
    assert (
        cost_to_reach(curve, 0.2) == 0.0
        and cost_to_reach(curve, 0.35) == pytest.approx(5.0)
        and cost_to_reach(curve, 0.6) is None
    )
    costs = {
        "gen_cpu_s": 2.0,
        "real_grading_cpu_s": 16.0,
        "update_cpu_s": 2.0,
        "other_cpu_s": 0.0,
        "wm_grading_cpu_s": 0.0,
    }
    real = {"seed": 0, "steps": 2, "real_executions": 16, "curve": curve, **costs}
    wmrl = {
        "seed": 0,
        "steps": 8,
        "real_executions": 8,
        "wm_grading_cpu_s": 0.8,
        "curve": [{"cost_cpu_s": 0.0, "heldout": 0.2}, {"cost_cpu_s": 4.0, "heldout": 0.6}],
        **{k: v for k, v in costs.items() if k != "wm_grading_cpu_s"},
    }
    h = headline(real, wmrl)
    # The real arm ends at 0.4 and first reaches it at 20/3 CPU-s; WMRL reaches 0.4 at 2 CPU-s.
    assert h["real_reach_cost"] == pytest.approx(20 / 3) and h["wmrl_reach_cost"] == pytest.approx(2.0)
    assert h["reach_ratio"] == pytest.approx(10 / 3)
    # Per step: real 1 + 8 + 1 = 10 CPU-s; WMRL 1 + 0.1 + 1 + (1/8) * 8 = 3.1 CPU-s.
    assert h["ideal_ratio"] == pytest.approx(10 / 3.1)
    flat = headline({**real, "curve": [{"cost_cpu_s": 0.0, "heldout": 0.3}, {"cost_cpu_s": 9.0, "heldout": 0.3}]}, wmrl)
    assert flat["reach_ratio"] is None and "no higher than its start" in flat["note"]
    never = headline(
        real, {**wmrl, "curve": [{"cost_cpu_s": 0.0, "heldout": 0.1}, {"cost_cpu_s": 5.0, "heldout": 0.3}]}
    )
    assert never["reach_ratio"] is None and "did not reach" in never["note"]


SMALL_CAL = dict(
    calibration_start_pairs=24, calibration_refit_every=8, calibration_half_life=8.0, calibration_freeze_after=3
)


def _ablation_args(run_dir, *extra):
    return ["ablation", "--run-dir", str(run_dir), "--no-progress", "--seeds", "0", "1", "--steps", "30",
            "--gradient-states", "0", "--gradient-warmup", "30", "--gradient-batches", "20", "--reference-batches", "60",
            "--calibration-start-pairs", "24", "--calibration-refit-every", "8", "--calibration-half-life", "8",
            "--calibration-freeze-after", "3", *extra]  # fmt: skip


def test_ablation_minimal_run_reports_every_variant_for_both_normalisations(tmp_path):
    run_dir = tmp_path / "ablation"
    assert main(_ablation_args(run_dir)) == 0
    result, markdown, _ = _read(run_dir)
    assert (run_dir / "ablation_gradient.png").stat().st_size > 0 and (
        run_dir / "ablation_training.png"
    ).stat().st_size > 0
    assert "**GRPO (std-scaled advantages)**" in markdown and "**Dr.GRPO (centred advantages, no std)**" in markdown
    rows = {(r["world_model"], r["normalisation"], r["variant"]): r for r in result["summary"]}
    assert len(rows) == 2 * 2 * 6
    for (wm, _norm, variant), row in rows.items():
        assert row["seeds"] == 2 and f"| {wm} | {variant} |" in markdown
        assert 0.0 <= row["grad_err"] <= 1.0 and 0.0 <= row["heldout_score"] <= 1.0
        if variant in ("none", "debias", "wm-only", "real"):
            assert row["final_weight"] == 1.0  # no denoising: the weight never moves
        if variant in ("none", "denoise", "debias", "both"):
            assert row["fitted_at_step"] is not None  # 30 steps x >= 1 anchor group x 4 > 24 pairs
    uniform = result["uniform_policy_score"]["heldout"]
    assert rows[("learned", "std", "real")]["heldout_score"] > uniform  # the policy learns


def _small(**changes):
    from benchmarks.ablation import AblationConfig

    base = dict(seeds=(0,), steps=10, gradient_warmup=60, gradient_batches=120, reference_batches=600, **SMALL_CAL)
    return AblationConfig(**{**base, **changes})


def _gradient_errors(config):
    import numpy as np

    from benchmarks.ablation import SoftmaxPolicy, _reference, _scorer, gradient_error, load_tasks

    train, _ = load_tasks(config)
    policy = SoftmaxPolicy(len(train.vocabulary))
    reference = _reference(policy, train, config, config.normalisations, np.random.default_rng(5))
    return gradient_error(config, train, _scorer("noisy-oracle", config, train, 0, None), 0, policy, reference)


def test_ablation_policy_gradient_is_the_grpo_loss_gradient():
    """The closed form used for measure (a) equals minus the autograd gradient of
    agents.grpo.grpo_loss over the same members (zero advantages dropped as the trainer does)."""
    import numpy as np

    from benchmarks.ablation import (
        AnchorScheduler,
        SoftmaxPolicy,
        _Arm,
        _draw,
        _loss,
        _scorer,
        load_tasks,
        policy_gradient,
    )

    config = _small(oracle_sigma=0.2)
    train, _ = load_tasks(config)
    policy = SoftmaxPolicy(len(train.vocabulary))
    policy.theta.data[:] = torch_randn(len(train.vocabulary))
    batch = _draw(
        policy,
        train,
        _scorer("noisy-oracle", config, train, 0, None),
        AnchorScheduler(0.3, seed=1),
        config,
        np.random.default_rng(2),
    )
    for norm in ("std", "centred"):
        adv = _Arm("none", config).advantages(batch, norm)
        policy.theta.grad = None
        _loss(policy, train, batch, adv).backward()
        assert np.allclose(
            policy_gradient(train, batch, adv, len(train.vocabulary)), -policy.theta.grad.numpy(), atol=1e-12
        )


def torch_randn(n):
    import torch

    return torch.randn(n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def test_ablation_with_a_perfect_world_model_every_variant_has_the_real_gradient():
    """An unbiased noiseless oracle: every variant's batch gradients are real execution's
    (exactly for the variants without a map; the map is the identity on the scores it has
    seen), so every gradient error equals the `real` row and the bias is at its noise floor."""
    errors = _gradient_errors(_small(oracle_bias="identity", oracle_sigma=0.0))
    for norm in ("std", "centred"):
        real = errors[("real", norm)]
        assert real["grad_dir_bias"] < 0.01
        for variant in ("none", "denoise", "wm-only"):
            assert errors[(variant, norm)] == real
        for variant in ("debias", "both"):
            assert errors[(variant, norm)]["grad_err"] == pytest.approx(real["grad_err"], abs=0.01)
            assert errors[(variant, norm)]["grad_dir_bias"] < 0.01
            assert errors[(variant, norm)]["weight_at_measure"] < 1.01  # (almost) no disagreement: (almost) no weight


def test_ablation_debiasing_removes_a_known_bias_from_the_gradient():
    """A noiseless oracle with a strongly non-linear monotone bias (r -> r^4): GRPO's centring
    and std scaling cannot cancel it, the isotonic map can. Debiasing brings the gradient's
    direction bias down to real execution's noise floor; without it the bias stays."""
    errors = _gradient_errors(_small(oracle_bias="power:4", oracle_sigma=0.0))
    for norm in ("std", "centred"):
        floor = errors[("real", norm)]["grad_dir_bias"]
        for variant in ("none", "wm-only"):
            assert errors[(variant, norm)]["grad_dir_bias"] > floor + 0.02, (variant, norm, errors[(variant, norm)])
        for variant in ("debias", "both"):
            assert errors[(variant, norm)]["grad_dir_bias"] < floor + 0.005
            assert errors[(variant, norm)]["grad_err"] < errors[("none", norm)]["grad_err"]


def test_fidelity_minimal_run(tmp_path):
    run_dir = tmp_path / "fidelity"
    args = ["fidelity", "--run-dir", str(run_dir), "--no-progress", "--models", "learned", "noisy-oracle",
            "--oracle-bias", "identity", "--oracle-sigma", "0", "--seeds", "0", "1"]  # fmt: skip
    assert main(args) == 0
    result, markdown, _ = _read(run_dir)
    assert (run_dir / "fidelity.png").stat().st_size > 0
    rows = {r["model"]: r for r in result["summary"]}
    assert set(rows) == {"learned", "noisy-oracle"} and "| metric | learned | noisy-oracle |" in markdown
    exact = rows["noisy-oracle"]  # the logged truth itself
    assert exact["status_accuracy"] == 1.0 and exact["spearman"] == pytest.approx(1.0)
    assert exact["mae_before"] == pytest.approx(0.0, abs=1e-12)
    learned = rows["learned"]
    assert 0.0 < learned["coverage"] <= 1.0 and learned["n_records"] == exact["n_records"]
    assert learned["spearman"] is None or -1.0 <= learned["spearman"] <= 1.0


def test_leaderboard_minimal_run(tmp_path):
    import torch

    from agents.llm.loading import load_policy

    checkpoint = tmp_path / "ckpt"  # the untrained tiny model's own weights, saved as a checkpoint
    checkpoint.mkdir()
    torch.save(load_policy("tiny").trainable_state_dict(), checkpoint / "policy.pt")
    run_dir = tmp_path / "leaderboard"
    args = ["leaderboard", "--run-dir", str(run_dir), "--no-progress", "--agents", "strong-baseline", "random-plan",
            "untrained", f"checkpoint:{checkpoint}", "--policy", "tiny", "--max-tasks", "1", "--k", "2", "--max-new-tokens", "8"]  # fmt: skip
    assert main(args) == 0
    result, markdown, _ = _read(run_dir)
    assert (run_dir / "leaderboard.png").stat().st_size > 0
    rows = {r["agent"]: r for r in result["summary"]}
    assert list(rows) == ["strong-baseline", "random-plan", "untrained", f"checkpoint:{checkpoint}"]
    same = [
        {k: v for k, v in r.items() if k.startswith("task:") or k == "valid_rate"}
        for r in result["per_seed"]
        if r["agent"] != "strong-baseline"
    ][1:]
    assert same[0] == same[1]  # same weights, same seed: the checkpoint agent reproduces the untrained one
    for agent, row in rows.items():
        assert f"| {agent} |" in markdown
        assert 0.0 <= row["valid_rate"] <= 1.0
        assert row["avg_at_k"] is None or 0.0 <= row["avg_at_k"] <= 1.0
    assert rows["strong-baseline"]["valid_rate"] == 1.0  # the fixed gradient-boosting solution runs
    assert rows["untrained"]["valid_rate"] == 0.0  # a random tiny model writes no valid plan


def test_config_files_and_flags(tmp_path):
    assert (
        build_config(SpeedupConfig, load_config("speedup-main")) == SpeedupConfig()
    )  # the file spells out the defaults
    full = build_config(SpeedupConfig, load_config("speedup-full"))
    assert (
        full.tier == "full"
        and full.seeds == (0, 1, 2)
        and full.anchor_min_per_step == 0
        and full.eval_max_tasks is None
    )
    custom = tmp_path / "c.json"
    custom.write_text(json.dumps({"steps": 7, "seeds": [3, 4]}))
    assert build_config(AblationConfig, load_config(custom)).seeds == (3, 4)
    with pytest.raises(ValueError, match="unknown SpeedupConfig settings \\['stepz'\\]"):
        build_config(SpeedupConfig, {"stepz": 3})
    with pytest.raises(ValueError, match="arms must be"):
        SpeedupConfig(arms=("real", "bogus"))
    with pytest.raises(ValueError, match="vectorization must be 'sync' or 'async', got 'ray'"):
        SpeedupConfig(vectorization="ray")  # Ray workers' CPU would escape the budget
    with pytest.raises(ValueError, match="rich scaffold's plans take"):
        SpeedupConfig(scaffold="rich", max_new_tokens=32)  # a cut plan would shrink the action space silently
    assert SpeedupConfig(scaffold="rich", max_new_tokens=96).scaffold == "rich"
    with pytest.raises(FileNotFoundError, match="shipped configs"):
        load_config("no-such-config")
    ablation_only = tmp_path / "a.toml"
    ablation_only.write_text("oracle_sigma = 0.3\n")
    assert main(["speedup", "--config", str(ablation_only)]) == 2  # an ablation knob is not a speedup knob


def test_ablation_informative_selection_passes_over_groups_of_copies():
    """With a policy that mostly draws one solution, most groups are copies: random anchors
    land on them, informative ones never do, at the same realized share."""
    import numpy as np

    from benchmarks.ablation import AnchorScheduler, SoftmaxPolicy, _draw, load_tasks

    shares = {}
    for selection in ("random", "informative"):
        config = _small(anchor_selection=selection, anchor_min_per_step=0)
        train, _ = load_tasks(config)
        policy = SoftmaxPolicy(len(train.vocabulary))
        policy.theta.data[0] = 3.0  # one template dominates wherever it exists
        scheduler = AnchorScheduler(0.2, 0, seed=4)
        rng = np.random.default_rng(8)
        copies = picked = 0
        for _ in range(150):
            batch = _draw(policy, train, None, scheduler, config, rng)
            picked += len(batch.anchors)
            copies += sum(len(set(batch.picks[g].tolist())) < 2 for g in batch.anchors)
        shares[selection] = (copies, picked, scheduler.realized_fraction)
    assert shares["random"][0] > 0 and shares["informative"][0] == 0
    assert shares["informative"][2] == pytest.approx(0.2, abs=0.02)
