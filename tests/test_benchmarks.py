"""wmrl-bench: every experiment on a minimal budget writes consistent outputs; config plumbing."""

import json

import pytest

from benchmarks.__main__ import main
from benchmarks.ablation import AblationConfig
from benchmarks.common import load_config
from benchmarks.speedup import SpeedupConfig
from wmrl_envs.config_cli import build_config

pytest.importorskip("transformers")


def _read(run_dir):
    result = json.loads((run_dir / "results.json").read_text())
    markdown = (run_dir / "results.md").read_text()
    config = json.loads((run_dir / "config.json").read_text())
    return result, markdown, config


def test_speedup_minimal_run_is_internally_consistent(tmp_path, capsys):
    run_dir = tmp_path / "speedup"
    rc = main(["speedup", "--config", "speedup-smoke", "--run-dir", str(run_dir), "--no-progress", "--eval-before", "false", "--max-new-tokens", "20", "--eval-k", "1"])
    assert rc == 0
    result, markdown, config = _read(run_dir)
    out = capsys.readouterr().out
    assert "heldout_vs_cost.png" in out and "results.json" in out  # the CLI says where things are
    assert (run_dir / "heldout_vs_cost.png").stat().st_size > 0
    assert config["policy"] == "tiny-plan" and config["steps"] == 2

    arms = {r["arm"]: r for r in result["per_seed"]["arms"]}
    assert set(arms) == {"real", "wm", "wmrl"}
    for arm in ("real", "wm", "wmrl"):
        assert f"| {arm} |" in markdown
        row = arms[arm]
        assert row["steps"] == 2 and len(result["histories"][f"{arm}-seed0"]) == 2
        parts = sum(row[k] for k in ("gen_cpu_s", "real_grading_cpu_s", "wm_grading_cpu_s", "update_cpu_s", "other_cpu_s"))
        assert 0 < parts <= row["cpu_s"] * 1.05 + 1.0  # components are part of the measured total
        assert row["gen_cpu_s"] > 0 and row["wall_s"] > 0
    # The raw world-model arm never executes; the real arm executes every graded request;
    # WMRL executes only its anchor groups (at most group_size x max_turns per anchor group).
    assert arms["wm"]["real_executions"] == 0 and arms["wm"]["real_grading_cpu_s"] < 0.5
    assert arms["real"]["real_executions"] > 0
    anchor_groups = round(arms["wmrl"]["anchor_share"] * 2 * 2)
    assert anchor_groups == 2  # floor of 1 anchor group in each of the 2 steps of 2 groups
    assert arms["wmrl"]["real_executions"] <= anchor_groups * 2
    # Ratios are exactly those of the measured numbers in the same file.
    ratios = {r["arm"]: r for r in result["per_seed"]["ratios"]}
    for arm in ("wm", "wmrl"):
        assert ratios[arm]["wall_speedup"] == pytest.approx(arms["real"]["wall_s"] / arms[arm]["wall_s"])
        assert ratios[arm]["cpu_speedup"] == pytest.approx(arms["real"]["cpu_s"] / arms[arm]["cpu_s"])
        assert ratios[arm]["real_exec_share"] == pytest.approx(arms[arm]["real_executions"] / arms["real"]["real_executions"])
        assert ratios[arm]["ideal_no_anchor"] >= ratios[arm]["ideal_at_anchor"] > 0
    assert ratios["wm"]["real_exec_share"] == 0.0
    assert "wall speedup" in markdown and "ideal (at anchor share)" in markdown
    for r in result["arms"]:
        assert r["heldout_avg_at_k"] is None or 0.0 <= r["heldout_avg_at_k"] <= 1.0
        assert 0.0 <= r["heldout_valid_rate"] <= 1.0


# ------------------------------------------------------------------ ablation
SMALL_CAL = dict(calibration_start_pairs=24, calibration_refit_every=8, calibration_half_life=8.0, calibration_freeze_after=3)


def _ablation_args(run_dir, *extra):
    return ["ablation", "--run-dir", str(run_dir), "--no-progress", "--seeds", "0", "1", "--steps", "30",
            "--gradient-states", "0", "--gradient-warmup", "30", "--gradient-batches", "20", "--reference-batches", "60",
            "--calibration-start-pairs", "24", "--calibration-refit-every", "8", "--calibration-half-life", "8",
            "--calibration-freeze-after", "3", *extra]  # fmt: skip


def test_ablation_minimal_run_reports_every_variant_for_both_normalisations(tmp_path):
    run_dir = tmp_path / "ablation"
    assert main(_ablation_args(run_dir)) == 0
    result, markdown, _ = _read(run_dir)
    assert (run_dir / "ablation_gradient.png").stat().st_size > 0 and (run_dir / "ablation_training.png").stat().st_size > 0
    assert "**GRPO (std-scaled advantages)**" in markdown and "**Dr.GRPO (centred advantages, no std)**" in markdown
    rows = {(r["world_model"], r["normalisation"], r["variant"]): r for r in result["summary"]}
    assert len(rows) == 2 * 2 * 6
    for (wm, norm, variant), row in rows.items():
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

    from benchmarks.ablation import AnchorScheduler, SoftmaxPolicy, _Arm, _draw, _loss, _scorer, load_tasks, policy_gradient

    config = _small(oracle_sigma=0.2)
    train, _ = load_tasks(config)
    policy = SoftmaxPolicy(len(train.vocabulary))
    policy.theta.data[:] = torch_randn(len(train.vocabulary))
    batch = _draw(policy, train, _scorer("noisy-oracle", config, train, 0, None), AnchorScheduler(0.3, seed=1), config, np.random.default_rng(2))
    for norm in ("std", "centred"):
        adv = _Arm("none", config).advantages(batch, norm)
        policy.theta.grad = None
        _loss(policy, train, batch, adv).backward()
        assert np.allclose(policy_gradient(train, batch, adv, len(train.vocabulary)), -policy.theta.grad.numpy(), atol=1e-12)


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
    same = [{k: v for k, v in r.items() if k.startswith("task:") or k == "valid_rate"} for r in result["per_seed"] if r["agent"] != "strong-baseline"][1:]
    assert same[0] == same[1]  # same weights, same seed: the checkpoint agent reproduces the untrained one
    for agent, row in rows.items():
        assert f"| {agent} |" in markdown
        assert 0.0 <= row["valid_rate"] <= 1.0
        assert row["avg_at_k"] is None or 0.0 <= row["avg_at_k"] <= 1.0
    assert rows["strong-baseline"]["valid_rate"] == 1.0  # the fixed gradient-boosting solution runs
    assert rows["untrained"]["valid_rate"] == 0.0  # a random tiny model writes no valid plan


def test_config_files_and_flags(tmp_path):
    assert build_config(SpeedupConfig, load_config("speedup-main")) == SpeedupConfig()  # the file spells out the defaults
    full = build_config(SpeedupConfig, load_config("speedup-full"))
    assert full.calibration_start_pairs == 200 and full.seeds == (0, 1, 2) and full.eval_max_tasks is None
    custom = tmp_path / "c.json"
    custom.write_text(json.dumps({"steps": 7, "seeds": [3, 4]}))
    assert build_config(AblationConfig, load_config(custom)).seeds == (3, 4)
    with pytest.raises(ValueError, match="unknown SpeedupConfig settings \\['stepz'\\]"):
        build_config(SpeedupConfig, {"stepz": 3})
    with pytest.raises(ValueError, match="arms must be"):
        SpeedupConfig(arms=("real", "bogus"))
    with pytest.raises(FileNotFoundError, match="shipped configs"):
        load_config("no-such-config")
    ablation_only = tmp_path / "a.toml"
    ablation_only.write_text("oracle_sigma = 0.3\n")
    assert main(["speedup", "--config", str(ablation_only)]) == 2  # an ablation knob is not a speedup knob
