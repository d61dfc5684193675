"""A newcomer's first hour (issue 16): one-line errors before anything heavy loads, warnings for
runs that cannot learn, self-describing checkpoints, and the guards on silent semantic slips."""

from __future__ import annotations

import json
import warnings
from types import SimpleNamespace

import pytest
import torch

import agents.llm.__main__ as cli
import agents.llm.loading as loading
from agents.grpo.diagnostics import CorrectionsIdleWarning, NoLearningSignalWarning, SignalWatch
from agents.llm.checks import UsageError, check_policy, check_tasks, resolve_checkpoint
from wrappers.handle import anchors_per_step, corrections_budget


# ------------------------------------------------------------------ CLI: one line, before loading
@pytest.fixture
def no_model_load(monkeypatch):
    """Any model load fails the test: the checks must run before it."""

    def boom(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(loading, "load_policy", boom)


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["train", "--policy", "tinny", "--output-dir", "X"], "--policy 'tinny' is unknown (did you mean 'tiny'?)"),
        (["train", "--tasks", "titanc", "--output-dir", "X"], "unknown task 'titanc' (did you mean 'titanic'?)"),
        (
            ["train", "--tasks", "ames", "--output-dir", "X"],
            "'ames' is a test-split task but --tasks takes train-split",
        ),
        (["train", "--eval-tasks", "titanic", "--output-dir", "X"], "'titanic' is a train-split task"),
        (["train", "--stack", "wmlr", "--output-dir", "X"], "--stack 'wmlr' is not valid (did you mean 'wmrl'?)"),
        (
            ["train", "--scaffold", "code", "--output-dir", "X"],
            "--scaffold 'code' is not valid; choose one of: plan, raw",
        ),
        (["train", "--stack", "wmrl", "--world-model", "/no/such", "--output-dir", "X"], "is not a directory"),
        (["train", "--policy", "tiny"], "train needs --output-dir"),
        (["evaluate", "--checkpoint", "/no/such/run"], "--checkpoint '/no/such/run' does not exist"),
        (["evaluate", "--tasks", "titanic"], "'titanic' is a train-split task but --tasks takes test-split"),
        (["evaluate", "--split", "train", "--tasks", "ames"], "'ames' is a test-split task but --tasks takes train"),
        (["evaluate", "--split", "dev"], "--split 'dev' is not valid"),
        (["train", "--eval-split", "train", "--output-dir", "X"], "--eval-split 'train': train's before / after"),
        (["evaluate", "--policy", "./no/such/model"], "is not a local directory"),
    ],
)
def test_cli_mistakes_fail_in_one_line_before_loading(argv, expected, no_model_load, capsys, tmp_path):
    argv = [str(tmp_path / "out") if a == "X" else a for a in argv]
    before = warnings.formatwarning
    assert cli.main(argv) == 2
    assert warnings.formatwarning is before  # the CLI's one-line warning format does not leak
    err = capsys.readouterr().err.strip()
    assert expected in err, err
    assert "\n" not in err and "Traceback" not in err


def test_policy_check_never_sends_a_typo_to_the_hub(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(UsageError, match="did you mean 'default'"):
        check_policy("defualt")
    assert check_policy("tiny-plan") == "tiny-plan"
    assert check_policy("HuggingFaceTB/SmolLM2-135M") == "HuggingFaceTB/SmolLM2-135M"  # a hub id is let through
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UsageError, match="not in the local Hugging Face cache"):
        check_policy("HuggingFaceTB/SmolLM2-135M-not-cached")


def test_task_checks_accept_the_right_split_and_any_tier():
    assert check_tasks(["titanic", "flights_late"], split="train") == ["titanic", "flights_late"]
    assert check_tasks(None, split="train") is None
    with pytest.raises(UsageError, match="is a train-split task"):
        check_tasks(["flights_late"], split="test", flag="--tasks")


# ------------------------------------------------------------------ warnings for runs that cannot learn
def _fake_train(monkeypatch, env, rewards_per_group, *, total_steps=3, patience=3, groups=2, size=2, **kw):
    """Run the GRPO loop with a rollout that returns the given rewards (no model, no env steps)."""
    import agents.llm.trainer as trainer
    from agents.grpo import train
    from agents.llm.rollout import Episode

    class FixedRollout:
        def __init__(self, *args, **kwargs):
            pass

        def run(self, chosen, timer, seed):
            out = []
            for j, (_, gid) in enumerate(chosen):
                for m in range(size):
                    reward = rewards_per_group[j][m]
                    out.append(Episode(m, "t", gid, None, [], reward=reward, source=None, final_info={}))
            return out

    monkeypatch.setattr(trainer, "Rollout", FixedRollout)
    monkeypatch.setattr(trainer, "_update", lambda *a: {})
    policy = SimpleNamespace(trainable_parameters=lambda: [torch.nn.Parameter(torch.zeros(1))])
    config = trainer.GRPOConfig(
        groups_per_step=groups, group_size=size, total_steps=total_steps, progress=False, tensorboard=False,
        no_signal_patience=patience, **kw,
    )  # fmt: skip
    return train(trainer.LLMAgent(policy, env, None, config, tasks=["t"]))


def test_no_learning_signal_warns_with_the_reason_and_the_remedy(monkeypatch):
    with pytest.warns(NoLearningSignalWarning, match="no group carried a learning signal in steps 1-3"):
        result = _fake_train(monkeypatch, None, [[0.0, 0.0], [0.0, 0.0]])
    assert result.steps_without_signal == 3 and len(result.warnings) == 1


def test_a_step_with_signal_does_not_warn(monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoLearningSignalWarning)
        result = _fake_train(monkeypatch, None, [[0.0, 0.5], [0.0, 0.0]])
    assert result.steps_without_signal == 0 and result.warnings == []


def test_signal_watch_names_the_malformed_cause_and_resets_on_signal():
    watch = SignalWatch(patience=2)
    flat = {"groups/used": 2, "groups/degenerate": 2, "reward/malformed_rate": 1.0, "reward/valid_rate": 0.0}
    assert watch.update(1, flat) is None
    text = watch.update(2, flat)
    assert text is not None and "warm-start" in text and "100% malformed" in text
    assert watch.update(3, flat) is None  # one warning per streak
    assert watch.update(4, {"groups/used": 2, "groups/degenerate": 1}) is None
    skipped = {"groups/used": 0, "groups/skipped": 2, "groups/degenerate": 0}
    watch.update(5, skipped)
    assert "unknown" in (watch.update(6, skipped) or "")


def test_signal_watch_tells_a_collapse_from_a_policy_that_never_wrote_the_format():
    """Seen in the full-tier protocol: a policy at 100% valid replies went to 100% malformed
    within two updates and stayed there (every group equal, no gradient)."""
    watch = SignalWatch(patience=2)
    watch.update(1, {"groups/used": 2, "groups/degenerate": 1, "reward/valid_rate": 1.0, "reward/malformed_rate": 0.0})
    flat = {"groups/used": 2, "groups/degenerate": 2, "reward/malformed_rate": 1.0, "reward/valid_rate": 0.0}
    watch.update(2, flat)
    text = watch.update(3, flat) or ""
    assert "collapsed" in text and "100% valid at step 1" in text and "warm-start" not in text


def test_idle_corrections_warn_before_a_short_wmrl_run(monkeypatch):
    from wrapper_toys import SyntheticWorldModel, ToySeamEnv

    from wrappers import AnchorWrapper, CalibrationWrapper, WorldModelWrapper

    def stack(start_pairs):
        return CalibrationWrapper(
            AnchorWrapper(WorldModelWrapper(ToySeamEnv(), SyntheticWorldModel())), start_pairs=start_pairs
        )

    with pytest.warns(CorrectionsIdleWarning, match="needs 200 anchor pairs"):
        _fake_train(monkeypatch, stack(200), [[0.0, 0.5], [0.0, 0.5]])
    with warnings.catch_warnings():
        warnings.simplefilter("error", CorrectionsIdleWarning)
        _fake_train(monkeypatch, stack(4), [[0.0, 0.5], [0.0, 0.5]])  # 3 steps x 1 anchor x 2 >= 4


def test_corrections_budget_arithmetic():
    assert (
        anchors_per_step(0.10, 1, 4) == 1.0 and anchors_per_step(0.5, 1, 10) == 5.0 and anchors_per_step(0, 1, 4) == 0
    )
    assert corrections_budget(start_pairs=200, pairs_seen=190, steps=3, anchors_per_step=1, group_size=4) is None
    text = corrections_budget(start_pairs=200, pairs_seen=0, steps=20, anchors_per_step=1, group_size=4)
    assert text is not None and "about 50 steps" in text


# ------------------------------------------------------------------ self-describing checkpoints
def _checkpoint(tmp_path, setup, step=3, config=None):
    ck = tmp_path / "run" / "checkpoint"
    ck.mkdir(parents=True)
    (ck / "policy.pt").write_bytes(b"")
    (ck / "trainer.json").write_text(json.dumps({"step": step, "config": config or {}, "setup": setup}))
    return ck


def test_resume_prints_the_step_and_changes_and_refuses_another_policy(tmp_path, capsys):
    from agents.llm.trainer import GRPOConfig

    ck = _checkpoint(tmp_path, {"policy": "tiny", "stack": "wmrl", "lora": False, "scaffold": "plan"}, 3,
                     {"learning_rate": 1e-5, "total_steps": 3})  # fmt: skip
    grpo = GRPOConfig(learning_rate=1e-4, total_steps=10)
    step = cli._check_resume(ck, {"policy": "tiny", "stack": "wmrl", "lora": False, "scaffold": "raw"}, grpo)
    out = capsys.readouterr().out
    assert step == 3 and "resuming from step 3 of 10" in out
    assert "--learning-rate 1e-05 -> 0.0001" in out and "--scaffold 'plan' -> 'raw'" in out
    assert "total-steps" not in out  # raising the budget is what resuming is for
    with pytest.raises(UsageError, match="trained with --policy 'tiny', this run asks for 'default'"):
        cli._check_resume(ck, {"policy": "default", "stack": "wmrl", "lora": False}, grpo)
    with pytest.raises(UsageError, match="--stack 'wmrl'"):
        cli._check_resume(ck, {"policy": "tiny", "stack": "real", "lora": False}, grpo)
    assert cli._check_resume(tmp_path / "none", {}, grpo) is None


def test_evaluate_takes_a_run_directory_and_reuses_the_saved_policy(tmp_path, capsys):
    ck = _checkpoint(tmp_path, {"policy": "tiny", "lora": False, "scaffold": "raw", "max_turns": 2}, 5)
    run = cli.EvalRun(checkpoint=str(tmp_path / "run"))
    cli._adopt_checkpoint_setup(run, explicit={"checkpoint"})
    assert (run.policy, run.scaffold, run.max_turns, run.checkpoint) == ("tiny", "raw", 2, str(ck))
    assert f"evaluating {ck} (step 5; policy tiny, scaffold raw)" in capsys.readouterr().out
    with pytest.raises(UsageError, match="trained with --policy 'tiny', not 'default'"):
        cli._adopt_checkpoint_setup(cli.EvalRun(checkpoint=str(ck), policy="default"), explicit={"policy"})
    assert resolve_checkpoint(tmp_path / "run") == ck and resolve_checkpoint(ck) == ck
    with pytest.raises(UsageError, match="holds no policy.pt"):
        resolve_checkpoint(tmp_path)


def test_checkpoint_records_its_setup_and_refuses_another_policy_or_stack(tmp_path):
    from wrapper_toys import SyntheticWorldModel, ToySeamEnv

    from agents.grpo import load_checkpoint, save_checkpoint
    from agents.llm.policy import LLMPolicy
    from agents.llm.trainer import LLMAgent
    from wrappers import WorldModelWrapper

    a = LLMPolicy.tiny(seed=1, num_layers=1, hidden_size=32)
    opt = torch.optim.AdamW(a.trainable_parameters(), lr=1e-3)
    save_checkpoint(
        tmp_path / "ck", LLMAgent(a, None, None, tasks=["t"]), opt, step=2, extra={"setup": {"policy": "tiny"}}
    )
    assert json.loads((tmp_path / "ck/trainer.json").read_text())["setup"] == {"policy": "tiny"}
    other = LLMPolicy.tiny(seed=1, num_layers=2, hidden_size=32)
    with pytest.raises(ValueError, match="holds another policy's weights .*--policy and --lora it was trained with"):
        load_checkpoint(tmp_path / "ck", LLMAgent(other, None, None, tasks=["t"]), None)
    wm_env = WorldModelWrapper(ToySeamEnv(), SyntheticWorldModel())
    with pytest.raises(ValueError, match="saved from a bare env but this env is a world-model stack"):
        load_checkpoint(tmp_path / "ck", LLMAgent(a, wm_env, None, tasks=["t"]), None)


# ------------------------------------------------------------------ benchmarks: checks, warnings, help, plots
@pytest.mark.parametrize(
    "argv, expected",
    [
        (["leaderboard", "--tasks", "titanic"], "'titanic' is a train-split task but --tasks takes test-split"),
        (["leaderboard", "--tasks", "amess"], "unknown task 'amess' (did you mean 'ames'?)"),
        (["leaderboard", "--agents", "checkpoint:/no/such"], "checkpoint: '/no/such' does not exist"),
        (["leaderboard", "--policy", "tinny"], "--policy 'tinny' is unknown"),
    ],
)
def test_benchmark_cli_mistakes_fail_in_one_line(argv, expected, capsys, tmp_path):
    from benchmarks.__main__ import main

    assert main([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and "\n" not in err, err
    assert not list(tmp_path.iterdir())  # refused before a run directory was made


@pytest.mark.parametrize(
    "module, argv, expected",
    [
        ("wmrl_envs.autoresearch.cli", ["build-leaderboards", "--tasks", "nope"], "wmrl-tasks: unknown task 'nope'"),
        (
            "wmrl_envs.world_models.cli",
            ["fidelity", "--model", "/no/such", "--logs", "/no/such.jsonl"],
            "wmrl-wm: /no/such holds no CodeOutcomeModel",
        ),  # fmt: skip
        ("wmrl_envs.sandbox.cli", ["run", "/no/such.py"], "wmrl-sandbox: [Errno 2] No such file or directory"),
    ],
)
def test_data_tool_mistakes_fail_in_one_line(module, argv, expected, capsys, monkeypatch):
    import importlib

    monkeypatch.delenv("WMRL_TRACEBACK", raising=False)
    assert importlib.import_module(module).main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(expected) and "\n" not in err, err


def test_ablation_warns_when_the_corrections_cannot_engage():
    from benchmarks.ablation import AblationConfig

    text = AblationConfig(steps=20).idle_corrections()
    assert text is not None and "needs 200 anchor pairs" in text and "variants will be identical" in text
    assert AblationConfig(steps=20, calibration_start_pairs=64).idle_corrections() is None
    assert AblationConfig().idle_corrections() is None  # the shipped defaults engage


def test_help_is_plain_text_with_defaults_and_choices(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    out = capsys.readouterr().out
    assert "``" not in out and ":func:" not in out and ":class:" not in out
    assert "gradient clipping. (default: 1.0)" in " ".join(out.split())  # no "Default 1.0." twice
    assert "--loss-aggregation {token-mean,seq-mean-token-mean}" in out
    with pytest.raises(SystemExit):
        cli.main(["train", "--loss-aggregation", "token_mean"])
    assert "invalid choice: 'token_mean'" in capsys.readouterr().err


def test_leaderboard_plot_labels_k_and_skips_the_mean_of_one_task(monkeypatch, tmp_path):
    import benchmarks.leaderboard as lb

    figs = []
    monkeypatch.setattr(lb, "save_figure", lambda fig, path: figs.append(fig) or path)
    row = {"agent": "a", "avg_at_k": 0.0, "avg_at_k_sd": None, "task:ames": 0.0, "task:ames_sd": None}
    lb._plot([row], ["ames"], tmp_path / "p.png", 4)
    ax = figs[-1].axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["ames"] and ax.get_ylabel() == "avg@4 (real execution)"
    assert [t.get_text() for t in ax.texts] == ["0.00"]  # a zero bar is labelled, not invisible
    row2 = {**row, "task:oj": 0.5, "task:oj_sd": None, "avg_at_k": 0.25}
    lb._plot([row2], ["ames", "oj"], tmp_path / "p.png", 4)
    assert [t.get_text() for t in figs[-1].axes[0].get_xticklabels()] == ["mean over tasks", "ames", "oj"]


# ------------------------------------------------------------------ guards on silent semantic slips
def test_a_split_env_refuses_a_task_of_the_other_split_unless_overridden():
    import gymnasium as gym

    import wmrl_envs  # noqa: F401

    env = gym.make("wmrl/AutoResearch-v0", split="train", max_turns=1)
    with pytest.raises(ValueError, match="task 'ames' is in the 'test' split but this env samples split='train'"):
        env.reset(options={"task": "ames"})
    with pytest.warns(UserWarning, match="using test-split task 'ames' in a split='train' env"):
        _, info = env.reset(options={"task": "ames", "any_split": True})
    assert info["task_id"] == "ames" and info["split"] == "test"
    _, info = env.reset(options={"task": "titanic"})  # its own split: no fuss
    assert info["task_id"] == "titanic"
    explicit = gym.make("wmrl/AutoResearch-v0", tasks=["titanic", "ames"], max_turns=1)  # the user's own pool
    assert explicit.reset(options={"task": "ames"})[1]["task_id"] == "ames"


def test_one_group_id_gives_every_sub_env_the_same_task():
    import wmrl_envs  # noqa: F401
    from wmrl_envs.vector import make_vector_env

    env = make_vector_env("wmrl/AutoResearch-v0", 4, split="train", max_turns=1)
    try:
        _, infos = env.reset(seed=0, options={"group_id": "g0", "group_size": 4})
        assert len(set(infos["task_id"])) == 1  # one GRPO group, one task
        tasks = {env.reset(seed=0, options={"group_id": f"g{k}"})[1]["task_id"][0] for k in range(12)}
        assert len(tasks) > 1  # different groups still spread over the split
        _, infos = env.reset(seed=0)
        assert len(set(infos["task_id"])) > 1  # without a group each sub-env samples its own
    finally:
        env.close()


def test_vector_infos_are_typed_the_same_whatever_the_sub_env_order():
    import numpy as np

    import wmrl_envs  # noqa: F401
    from wmrl_envs.vector import make_vector_env
    from wmrl_envs.world_models import CodeOutcomeModel
    from wrappers import build_stack

    wm = CodeOutcomeModel.load_default()
    actions = ["no code here", "REQUEST_INFO: metric"]  # malformed (graded 0.0) / nothing graded (unknown)

    def step(order):
        env = build_stack(
            make_vector_env("wmrl/AutoResearch-v0", 2, split="train", max_turns=1, tasks=["titanic"]), "wm", wm
        )
        try:
            env.reset(seed=0)
            _, _, _, _, infos = env.step(np.array(actions[order:] + actions[:order], dtype=object))
        finally:
            env.close()
        flat = {**infos, **{f"final/{k}": v for k, v in infos["final_info"].items()}}
        return {k: v for k, v in flat.items() if isinstance(v, np.ndarray)}

    a, b = step(0), step(1)
    assert set(a) == set(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, (key, a[key], b[key])  # one type per key, whatever comes first
        if a[key].dtype.kind == "f":
            assert not np.isnan(a[key]).any() and not np.isnan(b[key]).any(), key  # unknown is masked, not NaN
    assert list(a["final/_trajectory_reward"]) == [True, False] and list(b["final/_trajectory_reward"]) == [False, True]


def test_graded_horizon_shortens_the_env_horizon_to_a_time_limit_below_it():
    import dataclasses

    import gymnasium as gym

    from wmrl_envs.libero.horizon import GradedHorizon, time_limit_of

    @dataclasses.dataclass
    class Config:
        max_episode_steps: int = 520

    class Stub(gym.Env):
        observation_space = gym.spaces.Discrete(1)
        action_space = gym.spaces.Discrete(1)
        config = Config()

    wrapped = GradedHorizon(gym.wrappers.TimeLimit(Stub(), 5))
    assert time_limit_of(wrapped) == 5 and wrapped.unwrapped.config.max_episode_steps == 5
    assert GradedHorizon(Stub()).unwrapped.config.max_episode_steps == 520  # no limit, no change


@pytest.mark.libero
def test_libero_make_with_max_episode_steps_grades_the_last_step_quietly():
    """gym.make(..., max_episode_steps=3): step 3 is graded (not a bare TimeLimit cut), and
    neither robosuite's macro-file advice nor EGL teardown tracebacks reach the user."""
    pytest.importorskip("libero.libero", reason="needs the libero extra")
    import subprocess
    import sys

    code = (
        "import json, numpy as np, gymnasium as gym, wmrl_envs\n"
        "env = gym.make('wmrl/LIBERO-Long-v0', task_id=0, image_size=32, max_episode_steps=3)\n"
        "env.reset(seed=0)\n"
        "out = [env.step(np.zeros(7)) for _ in range(3)]\n"
        "print(json.dumps([[bool(t), bool(tr), i.get('graded'), i.get('success')] for _, _, t, tr, i in out]))\n"
    )  # the env is deliberately not closed
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    steps = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [s[2] for s in steps] == [False, False, True] and steps[-1][1] is True and steps[-1][3] is not None
    assert "macro file" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


# ------------------------------------------------------------------ world-model feedback
def test_world_model_feedback_agrees_with_its_status_and_score():
    from types import SimpleNamespace

    from wmrl_envs.autoresearch.grading import grading_context
    from wmrl_envs.autoresearch.tasks import get_task
    from wmrl_envs.world_models import CodeOutcomeModel
    from wmrl_envs.world_models.code_outcome import _feedback

    task = get_task("titanic")
    scripts = [
        "import pandas as pd\ndf = pd.read_csv('data/train.csv')\nprint(df.shape)\n",  # writes nothing
        "import pandas as pd\nt = pd.read_csv('data/test.csv')\n"
        "pd.DataFrame({'id': t['id'], 'survived': 'no'}).to_csv('submission.csv', index=False)\n",
    ]
    outcomes = CodeOutcomeModel.load_default().predict([grading_context(task, 0, [])] * 2, scripts)
    for o in outcomes:
        assert o is not None and f"most likely {o.status}" in o.feedback
        assert f"predicted reward {o.score:.2f}" in o.feedback  # the number the reward is
    summary = SimpleNamespace(bad_imports=[], undefined_names=[], counts={})
    valid = _feedback("valid", {"valid": 0.57, "no_submission": 0.43}, 0.3, summary, 0.45)
    assert "does not appear to write" not in valid and "the run is no_submission (reward 0.2)" in valid
    assert "does not appear to write" in _feedback("no_submission", {"no_submission": 0.9}, None, summary, 0.2)
