"""LLM agent pieces: scaffolds, tiny policy, GRPO update, checkpoint round trip, avg@k metric."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from agents.llm.evaluate import summarize, task_score
from agents.llm.scaffolds import (
    MODEL_FAMILIES,
    Plan,
    PlanScaffold,
    RawCodeScaffold,
    TaskSpec,
    extract_script,
    parse_plan,
    render_plan,
)
from wmrl_envs.outcome import Outcome

pytest.importorskip("transformers")


# ------------------------------------------------------------------ scaffolds
@pytest.mark.parametrize(
    "text, expected",
    [
        ("Analysis.\n```python\nimport os\nprint(1)\n```\nDone.", "import os\nprint(1)"),
        ("```\nx = 1\n```\nthen\n```python\nimport a\n```", "import a"),  # tagged block wins
        ("```text\nshort\n```\n```\nimport numpy as np\nx = np.ones(3)\n```", "import numpy as np\nx = np.ones(3)"),
        ("I will do it.\n```python\nimport pandas as pd\ndf = 1", "import pandas as pd\ndf = 1"),  # unterminated
        ("Sure! import stuff later.\nimport pandas as pd\nx = 2", "import pandas as pd\nx = 2"),  # bare code
        ("No code here at all.", None),
        ("x = 1 without imports", None),
    ],
)
def test_extract_script(text, expected):
    assert extract_script(text) == expected


def _spec(**kw):
    base = dict(
        task_id="t",
        task_type="binary",
        metric="accuracy",
        target="y",
        id_column="id",
        submission_format="label",
        classes=("a", "b"),
    )
    return TaskSpec(**{**base, **kw})


def test_raw_scaffold_actions():
    sc = RawCodeScaffold()
    assert sc.to_action("think\n```py\nimport x\n```", _spec()) == "```python\nimport x\n```"
    assert sc.to_action("REQUEST_INFO: data_head", _spec()) == "REQUEST_INFO: data_head"
    assert "REQUEST_INFO" in sc.initial_messages("overview", _spec())[0]["content"]


def test_parse_plan_tolerates_markdown_aliases_and_clamps():
    plan = parse_plan(
        "Here is my plan:\n- **Model**: XGBoost\n* n_estimators = 5000\nmax_depth: none\nlearning_rate: 0.05\nscale: No\ncategorical: drop"
    )
    assert plan == Plan(
        model="gradient_boosting", n_estimators=300, max_depth=None, learning_rate=0.05, scale=False, categorical="drop"
    )
    assert parse_plan("model: random forest classifier\nC: -3").model == "random_forest"
    assert parse_plan("model: random forest classifier\nC: -3").C == 1.0  # non-positive C ignored
    assert parse_plan("model: a neural network") is None
    assert parse_plan("I like trees") is None


def test_plan_scaffold_passes_unreadable_plans_through_for_the_env_to_reject():
    sc = PlanScaffold()
    assert sc.to_action("just chatting", _spec()) == "just chatting"
    action = sc.to_action("model: knn\nn_neighbors: 7", _spec())
    assert (
        action.startswith("```python\n")
        and action.endswith("\n```")
        and "KNeighborsClassifier(n_neighbors=7)" in action
    )


def test_task_spec_from_autoresearch_reset_info_and_missing_fields():
    info = {
        "task_id": "wine",
        "title": "Wine",
        "target": "quality",
        "id_column": "id",
        "classes": [3, 4],
        "task_type": "multiclass",
        "metric": "log_loss",
        "submission_format": "proba_classes",
        "n_train": 10,
    }
    spec = TaskSpec.from_info(info)
    assert spec.classes == ("3", "4") and spec.stats == {"n_train": 10} and spec.question == "Wine"
    with pytest.raises(KeyError, match="target"):
        TaskSpec.from_info({k: v for k, v in info.items() if k != "target"})


@pytest.mark.parametrize(
    "task_type, fmt, classes, family",
    [
        ("binary", "proba_positive", ("no", "yes"), "gradient_boosting"),
        ("multiclass", "proba_classes", ("a", "b", "c"), "linear"),
        ("regression", "value", None, "random_forest"),
        ("multiclass", "label", ("a", "b", "c"), "knn"),
    ],
)
def test_rendered_plan_runs_and_writes_the_submission_format(tmp_path, task_type, fmt, classes, family):
    """Runs the rendered script for real (this interpreter) on a small synthetic table."""
    import pandas as pd

    rng = np.random.default_rng(0)
    n = 120
    df = pd.DataFrame(
        {
            "id": range(n),
            "x1": rng.normal(size=n),
            "x2": rng.normal(size=n),
            "cat": rng.choice(["u", "v", None], size=n),
        }
    )
    df.loc[::7, "x1"] = np.nan
    if task_type == "regression":
        df["y"] = 2 * df["x2"] + rng.normal(size=n)
    else:
        df["y"] = np.array(classes)[(df["x2"] > 0).astype(int) + (df["x2"] > 1).astype(int) * (len(classes) - 2)]
    (tmp_path / "data").mkdir()
    df.iloc[:90].to_csv(tmp_path / "data/train.csv", index=False)
    df.iloc[90:].drop(columns="y").to_csv(tmp_path / "data/test.csv", index=False)
    spec = _spec(task_type=task_type, submission_format=fmt, classes=classes)
    (tmp_path / "main.py").write_text(render_plan(Plan(model=family, n_estimators=20), spec))
    proc = subprocess.run([sys.executable, "main.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    sub = pd.read_csv(tmp_path / "submission.csv")
    expected = ["id", *classes] if fmt == "proba_classes" else ["id", "y"]
    assert list(sub.columns) == expected and len(sub) == 30
    if fmt == "proba_classes":
        assert np.allclose(sub[list(classes)].sum(axis=1), 1.0)


def test_every_family_renders():
    for family in MODEL_FAMILIES:
        compile(render_plan(Plan(model=family), _spec()), "main.py", "exec")


# ------------------------------------------------------------------ policy and update
@pytest.fixture(scope="module")
def tiny():
    from agents.llm.policy import LLMPolicy

    return LLMPolicy.tiny(seed=0)


def test_tiny_policy_generates_and_scores_exactly_the_sampled_tokens(tiny):
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "plan?"}]
    ctx = tiny.chat_ids(msgs)
    outs = tiny.generate([ctx, ctx], max_new_tokens=6, seed=3)
    assert all(1 <= len(o) <= 6 for o in outs)
    assert outs == tiny.generate([ctx, ctx], max_new_tokens=6, seed=3)  # seeded sampling is reproducible
    history = msgs + [{"role": "assistant", "content": tiny.decode(outs[0])}]
    follow = tiny.followup_ids(history, {"role": "user", "content": "feedback"}, ended_with_eos=False)
    assert tiny.tokenizer.decode(follow).endswith("<|im_start|>assistant\n") and "feedback" in tiny.tokenizer.decode(
        follow
    )
    seqs = [ctx + outs[0] + follow, ctx + outs[1]]
    masks = [[0] * len(ctx) + [1] * len(outs[0]) + [0] * len(follow), [0] * len(ctx) + [1] * len(outs[1])]
    lp, ent, mask = tiny.token_logprobs(seqs, masks, with_entropy=True)
    with torch.no_grad():
        ids = torch.tensor([seqs[1]])
        full = torch.log_softmax(tiny.model(ids).logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
    n = len(outs[1])
    assert torch.allclose(lp[1, len(ctx) - 1 : len(ctx) - 1 + n], full[-n:], atol=1e-5)
    assert float(mask.sum()) == len(outs[0]) + len(outs[1]) and (ent[mask.bool()] > 0).all()


def test_update_raises_logprob_of_positive_advantage_and_lowers_negative(tiny):
    from agents.llm.rollout import Episode
    from agents.llm.trainer import GRPOConfig, _update

    ctx = tiny.chat_ids([{"role": "user", "content": "choose"}])
    good, bad = (
        tiny.tokenizer("model: random_forest", add_special_tokens=False)["input_ids"],
        tiny.tokenizer("model: knn", add_special_tokens=False)["input_ids"],
    )
    eps = []
    for ids in (good, bad):
        e = Episode(0, "t", "g", _spec(), [])
        e.segments = [(ctx, False), (ids, True)]
        eps.append(e)

    def seq_lp():
        with torch.no_grad():
            lp, _, m = tiny.token_logprobs(*zip(*[e.sequence() for e in eps]))
        return (lp * m).sum(1)

    before = seq_lp()
    opt = torch.optim.AdamW(tiny.trainable_parameters(), lr=1e-3)
    metrics = _update(tiny, opt, eps, [1.0, -1.0], GRPOConfig(micro_batch_size=1, ppo_epochs=2, beta=0.01))
    after = seq_lp()
    assert after[0] > before[0] and after[1] < before[1]
    assert metrics["loss/tokens"] == len(good) + len(bad) and "loss/kl" in metrics


def test_checkpoint_round_trip_restores_weights_optimizer_and_rng(tmp_path):
    from agents.grpo import load_checkpoint, save_checkpoint
    from agents.llm.policy import LLMPolicy
    from agents.llm.trainer import LLMAgent

    a = LLMPolicy.tiny(seed=1, num_layers=1, hidden_size=32)
    opt = torch.optim.AdamW(a.trainable_parameters(), lr=1e-3)
    a.model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    torch.manual_seed(123)
    save_checkpoint(tmp_path / "ck", LLMAgent(a, None, None, tasks=["t"]), opt, step=7, extra={"note": "x"})
    expected_draw = torch.rand(3)
    b = LLMPolicy.tiny(seed=2, num_layers=1, hidden_size=32)
    opt_b = torch.optim.AdamW(b.trainable_parameters(), lr=1e-3)
    meta = load_checkpoint(tmp_path / "ck", LLMAgent(b, None, None, tasks=["t"]), opt_b)
    assert meta["step"] == 7 and meta["note"] == "x"
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))
    assert opt_b.state_dict()["state"][0]["step"] == 1
    assert torch.equal(torch.rand(3), expected_draw)
    save_checkpoint(
        tmp_path / "ck", LLMAgent(a, None, None, tasks=["t"]), opt, step=8, extra={}
    )  # overwrite keeps one valid checkpoint
    assert json.loads((tmp_path / "ck/trainer.json").read_text())["step"] == 8 and not (tmp_path / "ck.old").exists()


def test_lora_policy_trains_only_the_adapter_and_reference_is_the_base():
    pytest.importorskip("peft")
    from agents.llm.policy import LLMPolicy, LoraSettings

    p = LLMPolicy.tiny(
        seed=0, num_layers=1, hidden_size=32, lora=LoraSettings(r=4, alpha=8, target_modules=("q_proj", "v_proj"))
    )
    names = list(p.trainable_state_dict())
    assert names and all("lora_" in n for n in names)
    seq, mask = [[1, 2, 3, 4]], [[0, 1, 1, 1]]
    with torch.no_grad():
        for prm in p.trainable_parameters():
            prm.add_(0.5)
        lp, _, _ = p.token_logprobs(seq, mask)
        ref, _, _ = p.token_logprobs(seq, mask, reference=True)
    assert not torch.allclose(lp, ref)


# ------------------------------------------------------------------ avg@k metric
def _valid(p):
    return Outcome("valid", 0.5 + p / 2, metrics={"percentile": p})


def test_task_score_is_valid_rate_times_mean_best_percentile():
    trajs = [
        [_valid(0.2), _valid(0.6)],
        [Outcome("runtime_error", 0.1)],
        [_valid(0.4)],
        [Outcome("malformed", 0.0), None],
    ]
    s = task_score("t", "binary", trajs)
    assert s.valid_rate == 0.5 and s.mean_best_percentile == pytest.approx(0.5) and s.score == pytest.approx(0.25)
    # what each trajectory ended with: its last graded outcome (a trailing ungraded turn is skipped)
    assert s.statuses == {"malformed": 1, "runtime_error": 1, "valid": 2}
    assert task_score("t", "binary", [[None]]).statuses == {"ungraded": 1}
    assert task_score("t", "binary", [[Outcome("no_submission", 0.2)]]).score == 0.0
    unknown = Outcome("valid", None, metrics={"percentile": None})
    assert task_score("t", "binary", [[unknown]]).score is None
    with pytest.raises(ValueError, match="no trajectories"):
        task_score("t", "binary", [])


def test_summarize_averages_over_tasks_and_categories_skipping_unknown():
    scores = [
        task_score("a", "binary", [[_valid(0.8)]]),
        task_score("b", "binary", [[_valid(0.4)], [Outcome("timeout", 0.1)]]),
        task_score("c", "regression", [[Outcome("valid", None, metrics={"percentile": None})]]),
    ]
    r = summarize(scores)
    assert r.mean == pytest.approx((0.8 + 0.2) / 2)
    assert r.by_category == {"binary": pytest.approx(0.5), "regression": None}


# ------------------------------------------------------------------ multi-turn rollout on the real env
def test_multi_turn_rollout_masks_observation_tokens(tiny):
    """Random tiny-model replies are malformed: graded 0.0 by the env for free (no execution)."""
    import wmrl_envs  # noqa: F401
    from agents.llm.rollout import PhaseTimer, Rollout
    from wmrl_envs.vector import make_vector_env

    env = make_vector_env("wmrl/AutoResearch-v0", 2, split="train", max_turns=2)
    rollout = Rollout(env, tiny, PlanScaffold(), group_size=2, max_new_tokens=5)
    timer = PhaseTimer()
    episodes = rollout.run([("titanic", "g0")], timer, seed=0)
    assert len(episodes) == 2 and {e.group_id for e in episodes} == {"g0"}
    for e in episodes:
        ids, mask = e.sequence()
        runs = [k for k in range(1, len(mask)) if mask[k] == 1 and mask[k - 1] == 0]
        assert e.turns == 2 and len(runs) == 2 and mask[0] == 0  # two action spans, prompt masked
        between = tiny.tokenizer.decode(ids[runs[0] : runs[1]])
        assert "Result of your plan" in between and "malformed" in between  # the env's feedback, masked
        assert all(m == 0 for m in mask[runs[0] + sum(1 for _ in e.segments[1][0]) : runs[1]])
        assert e.reward == 0.0 and [o.status for o in e.outcomes] == ["malformed", "malformed"]
        assert e.texts[0].startswith("model:")  # the scaffold's response priming
    assert timer.wall["generation"] > 0


# ------------------------------------------------------------------ trainer: anchor weight
def test_train_reads_the_anchor_weight_after_the_rollout(monkeypatch):
    """The weight that scales a step's anchor advantages is the calibration layer's once the
    rollout is over, not the stale one in the last listed episode's final info (groups that
    finish after that episode move it)."""
    from types import SimpleNamespace

    from wrapper_toys import SyntheticWorldModel, ToySeamEnv

    import agents.llm.trainer as trainer
    from agents.grpo import train
    from agents.llm.rollout import Episode
    from wrappers import AnchorWrapper, CalibrationWrapper, WorldModelWrapper

    env = CalibrationWrapper(AnchorWrapper(WorldModelWrapper(ToySeamEnv(), SyntheticWorldModel())))

    class LateGroupRollout:
        def __init__(self, *args, **kwargs):
            pass

        def run(self, groups, timer, seed):
            (_, anchor_gid), (_, wm_gid) = groups
            env.weighter.ema_at_freeze, env.weighter.ema = 1.0, 2.0  # a group finishing last: weight 3.0
            stale = {"anchor_weight": 1.0, "calibrated": True}
            members = [(anchor_gid, 0.2, "env"), (anchor_gid, 0.8, "env"), (wm_gid, 0.3, "wm"), (wm_gid, 0.5, "wm")]
            return [
                Episode(i, "t", g, None, [], reward=r, source=s, anchor=s == "env", final_info=dict(stale))
                for i, (g, r, s) in enumerate(members)
            ]

    updates = []
    monkeypatch.setattr(trainer, "Rollout", LateGroupRollout)
    monkeypatch.setattr(trainer, "_update", lambda policy, opt, eps, adv, config: updates.append(adv) or {})
    policy = SimpleNamespace(trainable_parameters=lambda: [torch.nn.Parameter(torch.zeros(1))])
    config = trainer.GRPOConfig(groups_per_step=2, group_size=2, total_steps=1, progress=False, tensorboard=False)
    result = train(trainer.LLMAgent(policy, env, None, config, tasks=["t"]))
    assert result.history[0]["anchor/weight"] == 3.0
    assert updates[0][:2] == pytest.approx([-3.0, 3.0], rel=1e-4) and updates[0][2:] == pytest.approx(
        [-1.0, 1.0], rel=1e-4
    )
