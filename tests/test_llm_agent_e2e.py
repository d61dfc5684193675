"""End to end on CPU: a tiny policy trains through the full WMRL wrapper stack on real
AutoResearch tasks; only anchor groups execute for real; a killed run resumes with its
anchor pairs."""

import json

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

import wmrl_envs  # noqa: F401  (registers the env ids)
from agents.grpo import train
from agents.llm.policy import LLMPolicy
from agents.llm.scaffolds import PlanScaffold
from agents.llm.trainer import GRPOConfig, LLMAgent
from agents.llm.warm_start import warm_start
from wmrl_envs.vector import make_vector_env
from wmrl_envs.world_models import CodeOutcomeModel
from wrappers import (
    VectorAnchorWrapper,
    VectorCalibrationWrapper,
    VectorWorldModelWrapper,
    stack_state_dict,
)

TASKS = ["titanic", "penguins", "breast_cancer"]
GROUP = 2
MAX_TURNS = 2  # multi-turn: observation tokens between the agent's turns are masked out
WORLD_MODEL: dict = {}

# Plans a small model might write (text after the scaffold's "model:" prefix); the warm
# start makes the tiny random policy emit text like this, with sampling noise, so rollouts
# hold valid, weak and malformed plans.
DEMOS = [
    " random_forest\nn_estimators: 30\nmax_depth: 6",
    " linear\nC: 1.0\nscale: yes",
    " knn\nn_neighbors: 15",
    " baseline",
]


def _world_model():
    """The shipped CodeOutcomeModel, else one fitted on the shipped pool execution logs."""
    try:
        return CodeOutcomeModel.load_default()
    except FileNotFoundError:
        pass
    from wmrl_envs.autoresearch.leaderboard import logs_root
    from wmrl_envs.autoresearch.tasks import list_catalog
    from wmrl_envs.world_models import CodeOutcomeConfig, read_logs

    files = [logs_root() / f"{t}.jsonl" for t in list_catalog("train")]
    records = [r for f in files if f.is_file() for r in read_logs(f)]
    if not records:
        pytest.skip("no shipped world model and no shipped pool logs to fit one")
    return CodeOutcomeModel(CodeOutcomeConfig(max_iter=30)).fit(records)


def _stack(fraction: float):
    env = make_vector_env("wmrl/AutoResearch-v0", len(TASKS) * GROUP, split="train", max_turns=MAX_TURNS)
    env = VectorWorldModelWrapper(env, WORLD_MODEL.get("wm") or WORLD_MODEL.setdefault("wm", _world_model()), mode="wm")
    env = VectorAnchorWrapper(env, fraction=fraction, min_per_step=1, seed=0)
    # Small calibration thresholds so the map is fitted within the test's few anchor pairs.
    return VectorCalibrationWrapper(env, start_pairs=2, refit_every=1)


@pytest.fixture(scope="module")
def policy():
    from agents.llm.scaffolds import TaskSpec
    from wmrl_envs.autoresearch.tasks import get_task

    p = LLMPolicy.tiny(seed=0)
    specs = [TaskSpec.from_info({**get_task(t).to_json(), **get_task(t).meta_features()}) for t in TASKS]
    losses = warm_start(p, PlanScaffold(), specs, DEMOS, steps=60, learning_rate=1e-2)
    assert losses[-1] < losses[0] / 3
    return p


def test_wmrl_training_through_full_stack_executes_only_anchor_groups(policy, tmp_path):
    env = _stack(fraction=0.34)
    config = GRPOConfig(
        groups_per_step=len(TASKS),
        group_size=GROUP,
        total_steps=2,
        max_new_tokens=24,
        learning_rate=1e-3,
        micro_batch_size=6,
        output_dir=str(tmp_path / "run"),
        progress=False,
    )
    before = [p.detach().clone() for p in policy.trainable_parameters()]
    result = train(LLMAgent(policy, env, PlanScaffold(), config, tasks=TASKS))
    assert [h["step"] for h in result.history] == [1, 2]

    wm = env.env.env  # VectorWorldModelWrapper
    anchors = sum(round(h["anchor/realized_fraction"] * len(TASKS)) for h in result.history)
    per_step_real = [h["real_executions/step"] for h in result.history]
    # Real executions happen only inside anchor groups: at most GROUP * MAX_TURNS per anchor group.
    assert anchors >= 2  # min_per_step=1 in each of the 2 steps
    assert 0 < sum(per_step_real) == wm.counters.real_executions <= anchors * GROUP * MAX_TURNS
    assert wm.counters.wm_predictions > wm.counters.real_executions  # non-anchor groups: predicted only
    for h in result.history:
        assert h["anchor/realized_fraction"] >= 1 / len(TASKS) - 1e-9
        assert h["real_executions/step"] <= round(h["anchor/realized_fraction"] * len(TASKS)) * GROUP * MAX_TURNS
        assert h["episodes/turns_mean"] == MAX_TURNS
        assert h["time/generation_wall"] > 0 and h["anchor/weight"] >= 1.0
    # The update really changed the policy when any group had a learning signal.
    if any(h.get("loss/tokens") for h in result.history):
        assert any(not torch.equal(a, b) for a, b in zip(before, policy.trainable_parameters()))

    lines = (tmp_path / "run/metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]
    assert any(p.name.startswith("events") for p in (tmp_path / "run/tb").iterdir())
    saved = json.loads((tmp_path / "run/checkpoint/wrappers.json").read_text())
    assert saved["calibration"] == json.loads(json.dumps(stack_state_dict(env)["calibration"], default=str))
    best_before = json.loads((tmp_path / "run/checkpoint/trainer.json").read_text())["best_valid_rate"]
    assert best_before[0] == max(h["reward/valid_rate"] for h in result.history)

    # "Kill" the run after step 2 and resume in a fresh stack to step 3: the anchor pairs survive.
    pairs_before = len(env.debiaser.pairs)
    resumed_env = _stack(fraction=0.34)
    resumed = train(
        LLMAgent(policy, resumed_env, PlanScaffold(), GRPOConfig(**{**config.__dict__, "total_steps": 3}), tasks=TASKS),
        resume=True,
    )
    assert [h["step"] for h in resumed.history] == [3]
    # The best valid share survives the resume, so a later collapse is still named one.
    best_after = json.loads((tmp_path / "run/checkpoint/trainer.json").read_text())["best_valid_rate"]
    if resumed.history[0]["reward/valid_rate"] <= best_before[0]:
        assert best_after == best_before
    assert len(resumed_env.debiaser.pairs) >= pairs_before
    assert resumed.history[0]["calibration/anchor_pairs_total"] >= pairs_before


def test_informative_anchors_are_chosen_after_sampling_among_groups_with_distinct_scripts():
    """The same loop with ``selection="informative"``: groups are decided at their first step,
    from the world model's preview of the members' actions, so an anchor group always holds
    two or more distinct scripts, and the preview costs no second prediction. The replies
    are drawn from the demonstration plans (a tiny policy writes mostly malformed text, whose
    groups are never worth grading), so a quarter of the groups are copies of one plan."""
    policy = LLMPolicy.tiny(seed=0)
    draw = np.random.default_rng(0)

    def generate(contexts, **_):
        replies = [str(draw.choice(DEMOS)) for _ in contexts]
        return [policy.tokenizer(r, add_special_tokens=False)["input_ids"] + [policy.eos_token_id] for r in replies]

    policy.generate = generate  # type: ignore[method-assign]
    env = make_vector_env("wmrl/AutoResearch-v0", len(TASKS) * GROUP, split="train", max_turns=1)
    wm = VectorWorldModelWrapper(env, WORLD_MODEL.get("wm") or WORLD_MODEL.setdefault("wm", _world_model()))
    env = VectorCalibrationWrapper(
        VectorAnchorWrapper(wm, fraction=0.34, min_per_step=0, seed=0, selection="informative", keep_share=False),
        start_pairs=2,
    )
    episodes: list = []

    class Recording(LLMAgent):
        def collect(self, groups, rng):
            got, metrics = super().collect(groups, rng)
            episodes.extend(got)
            return got, metrics

    config = GRPOConfig(groups_per_step=len(TASKS), group_size=GROUP, total_steps=4, micro_batch_size=6, progress=False)
    result = train(Recording(policy, env, PlanScaffold(), config, tasks=TASKS))
    by_group: dict = {}
    for e in episodes:
        by_group.setdefault(e.group_id, []).append(e)
    anchor_groups = [g for g in by_group.values() if g[0].anchor]
    copies = [g for g in by_group.values() if len({e.actions[0] for e in g}) == 1]
    assert anchor_groups and copies, "the draw gave no anchor group or no group of copies: nothing is tested"
    assert all(len({e.actions[0] for e in g}) >= 2 for g in anchor_groups)  # never a group of copies
    assert all(all(e.anchor == g[0].anchor for e in g) for g in by_group.values())  # one decision per group
    assert sum(h["anchor/groups"] for h in result.history) == len(anchor_groups)
    graded = sum(e.graded_steps for e in episodes)
    assert wm.counters.wm_predictions == graded  # previewed once, not predicted again by the step
    assert wm.counters.real_executions == sum(e.graded_steps for g in anchor_groups for e in g) > 0
    env.close()
