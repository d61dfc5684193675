"""MiniVLA agent loops on a toy seam env (no MuJoCo): SFT, GRPO through real / wm / wmrl
stacks, resume, evaluation protocol."""

from __future__ import annotations

import json
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from agents.grpo import group_advantages, train
from agents.vla.demos import DemoDataset, DemoEpisode
from agents.vla.evaluate import RandomPolicy, evaluate_policy, success_metrics
from agents.vla.model import MiniVLA, MiniVLAConfig, collate
from agents.vla.rollout import run_episode, run_group
from agents.vla.sft import SFTConfig, train_sft
from agents.vla.tokenizer import dataset_statistics
from agents.vla.trainer import VLAAgent, VLAGRPOConfig, update
from wmrl_envs.outcome import Outcome
from wmrl_envs.seam import GradingRequest, OutcomeSeam
from wrappers import CalibrationConfig, build_stack

SIZE = 32
TINY = dict(image_size=SIZE, patch_size=16, width=32, llm_width=48, vision_layers=1, llm_layers=1)


class ToyReach(OutcomeSeam, gym.Env):
    """Move x past 0.5 within ``horizon`` steps (x += 0.1 * action[0]); graded like LiberoLongEnv:
    the final step executes no action and reports success; a world model sees the states."""

    metadata = {"render_modes": []}

    def __init__(self, horizon: int = 6):
        self.horizon = horizon
        self.observation_space = spaces.Dict({"proprio": spaces.Box(-np.inf, np.inf, (9,), np.float32)})
        self.action_space = spaces.Box(-1, 1, (7,), np.float32)
        self.images = np.random.default_rng(0).integers(0, 255, (2, SIZE, SIZE, 3), dtype=np.uint8)

    def _obs(self) -> dict[str, Any]:
        p = np.zeros(9, np.float32)
        p[0] = self.x
        return {
            "agentview_image": self.images[0],
            "wrist_image": self.images[1],
            "proprio": p,
            "instruction": "reach right",
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        options = options or {}
        assert set(options) <= {"init_state", "group_id"}, options  # like LiberoLongEnv
        self.x, self.turn, self.states = 0.0, 0, [0.0]
        self.group_id, self.init = options.get("group_id"), int(options.get("init_state", 0))
        return self._obs(), {"init_state": self.init, "group_id": self.group_id}

    def grading_request(self, action):
        if self.turn + 1 < self.horizon:
            return None
        traj = type(
            "T", (), {"instruction": "reach right", "states": np.array(self.states)[:, None] * np.ones((1, 2))}
        )()
        return GradingRequest({"task_id": "toy", "instruction": "reach right"}, traj, self.group_id)

    def grade(self, request):
        ok = self.x > 0.5
        return Outcome("success" if ok else "failure", float(ok), source="env")

    def apply(self, action, outcome):
        info: dict[str, Any] = {"group_id": self.group_id, "turn": self.turn}
        if self.turn + 1 >= self.horizon:
            score = None if outcome is None else outcome.score
            info.update(
                graded=True,
                outcome=outcome,
                trajectory_reward=score,
                success=None if outcome is None else outcome.status == "success",
            )
            self.turn += 1
            return self._obs(), float(score or 0.0), False, True, info
        self.x += 0.1 * float(np.clip(action[0], -1, 1))
        self.states.append(self.x)
        self.turn += 1
        info.update(graded=False)
        return self._obs(), 0.0, False, False, info


class ToyProgressWM:
    """Dense score: final x / 0.5, clipped (a biased but monotone world model)."""

    def predict(self, contexts, actions):
        out = []
        for a in actions:
            x = float(a.states[-1, 0])
            out.append(Outcome("success" if x > 0.5 else "failure", float(np.clip(x / 0.5, 0, 1)) ** 2, source="wm"))
        return out


def toy_statistics() -> dict[str, Any]:
    """Dataset statistics of one toy demo and 300 random actions (seeded)."""
    rng = np.random.default_rng(0)
    actions = np.clip(rng.normal(0, 0.5, (300, 7)), -1, 1)
    actions[:, -1] = np.sign(actions[:, -1])
    return DemoDataset([_demo(rng)]).statistics() | {"action": dataset_statistics(actions)["action"]}


@pytest.fixture(scope="module")
def stats():
    return toy_statistics()


def _demo(rng, n=12):
    a = np.clip(rng.normal(0.6, 0.1, (n, 7)), -1, 1).astype(np.float32)
    a[:, -1] = 1.0
    return DemoEpisode(
        "reach right",
        rng.integers(0, 255, (n, SIZE, SIZE, 3), dtype=np.uint8),
        rng.integers(0, 255, (n, SIZE, SIZE, 3), dtype=np.uint8),
        rng.normal(size=(n, 9)).astype(np.float32),
        a,
        {"task": 0},
    )


def _policy(stats, seed=0):
    torch.manual_seed(seed)
    return MiniVLA(MiniVLAConfig.tiny(**TINY), stats).eval()


def test_sft_fits_demos_checkpoints_and_resumes(tmp_path):
    rng = np.random.default_rng(1)
    data = DemoDataset([_demo(rng), _demo(rng)])
    path = data.save(tmp_path / "demos.npz")
    config = SFTConfig(
        demos=(str(path),),
        output_dir=str(tmp_path / "sft"),
        steps=30,
        batch_size=8,
        learning_rate=3e-3,
        warmup_steps=2,
        log_every=10,
        checkpoint_every=15,
        tensorboard=False,
        progress=False,
        **TINY,
    )
    result = train_sft(config)
    lines = [json.loads(x) for x in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["loss"] < lines[0]["loss"] and 0.0 <= lines[-1]["token_acc"] <= 1.0
    model = MiniVLA.load(result["checkpoint"])
    assert model.statistics["num_trajectories"] == 2
    # resume: a longer run continues from step 30
    result2 = train_sft(SFTConfig(**{**config.__dict__, "steps": 40}))
    assert result2["final"]["step"] == 40
    assert [json.loads(x)["step"] for x in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()] == [
        10,
        20,
        30,
        40,
    ]


def test_group_rollout_rows_and_first_epoch_unclipped(stats):
    env = build_stack(ToyReach(), "real", ToyProgressWM())
    policy = _policy(stats)
    eps = run_group(env, policy, "g0", 3, 4, generator=torch.Generator().manual_seed(0))
    assert len(eps) == 4 and all(e.group_id == "g0" and e.init_state == 3 for e in eps)
    assert all(len(e.rows) == 5 and e.token_tensor().shape == (5, 7) for e in eps)  # 6 steps, the graded one dropped
    assert all(e.reward in (0.0, 1.0) and e.source == "env" for e in eps)
    held = run_group(env, policy, "g1", 0, 2, generator=torch.Generator().manual_seed(0), action_repeat=2)
    assert all(len(e.rows) == 3 and e.steps == 6 for e in held)  # decisions at steps 0, 2, 4; step 5 graded
    adv = [1.0, -1.0, 0.5, -0.5]
    opt = torch.optim.SGD(policy.parameters(), lr=0.0)
    metrics = update(
        policy,
        opt,
        eps,
        adv,
        VLAGRPOConfig(ppo_epochs=2, rows_per_episode=None, micro_batch_size=8, temperature=1.0),
        np.random.default_rng(0),
    )
    assert metrics["loss/clip_frac_epoch0"] == 0.0 and abs(metrics["loss/ratio_mean_epoch0"] - 1.0) < 1e-4
    assert metrics["update/rows"] == 20


def test_update_raises_logprob_of_positive_advantage_rows(stats):
    env = build_stack(ToyReach(), "real", ToyProgressWM())
    policy = _policy(stats, seed=1)
    eps = run_group(env, policy, "g", 0, 2, generator=torch.Generator().manual_seed(1))
    before = [
        policy.token_logprobs(__import__("agents.vla.model", fromlist=["collate"]).collate(e.rows), e.token_tensor())
        .sum()
        .item()
        for e in eps
    ]
    opt = torch.optim.Adam(policy.parameters(), lr=3e-3)
    update(
        policy,
        opt,
        eps,
        [1.0, -1.0],
        VLAGRPOConfig(rows_per_episode=None, micro_batch_size=16, epsilon=10.0),
        np.random.default_rng(0),
    )
    after = [policy.token_logprobs(collate(e.rows), e.token_tensor()).sum().item() for e in eps]
    assert after[0] > before[0] and after[1] < before[1]


@pytest.mark.parametrize("stack", ["real", "wm", "wmrl"])
def test_grpo_through_each_stack_logs_costs_and_resumes(stats, stack, tmp_path):
    cal = CalibrationConfig(start_pairs=4, refit_every=4)
    env = build_stack(ToyReach(), stack, ToyProgressWM(), anchor_fraction=0.5, calibration=cal)
    policy = _policy(stats)
    config = VLAGRPOConfig(
        total_steps=2,
        groups_per_step=2,
        group_size=3,
        init_states=(0, 1),
        rows_per_episode=3,
        micro_batch_size=8,
        action_repeat=1,
        image_size=SIZE,
        output_dir=str(tmp_path / stack),
        tensorboard=False,
        progress=False,
        learning_rate=1e-3,
    )
    history = train(VLAAgent(policy, env, config)).history
    assert [h["step"] for h in history] == [1, 2]
    h = history[-1]
    for key in (
        "reward/mean",
        "groups/no_signal_share",
        "time/act_ms_per_action",
        "time/env_steps_per_s",
        "success/goal_reached",
        "real_executions/step",
    ):
        assert key in h
    assert h["groups/used"] == 2
    if stack == "real":
        assert h["real_executions/step"] == 6 and h["reward/wm"] is None
    elif stack == "wm":
        assert h["real_executions/step"] == 0 and h["reward/env"] is None
    else:
        assert h["groups/anchor"] >= 1 and h["real_executions/step"] >= 3
    ckpt = tmp_path / stack / "checkpoint"
    assert (ckpt / "model.pt").is_file() and json.loads((ckpt / "trainer.json").read_text())["step"] == 2
    assert (ckpt / "wrappers.json").is_file()
    more = train(
        VLAAgent(MiniVLA.load(ckpt), env, VLAGRPOConfig(**{**config.__dict__, "total_steps": 3})), resume=True
    ).history
    assert [h["step"] for h in more] == [3]


def test_no_signal_groups_are_counted():
    r = group_advantages([0.0, 0.0, 1.0, 0.0], ["a", "a", "b", "b"])
    assert r.stats.groups_degenerate == 1 and r.stats.groups_used == 2


def test_evaluation_protocol_on_toy_env():
    env = ToyReach()
    out = evaluate_policy(env, RandomPolicy(0), [0, 1, 2], trials=4, action_repeat=1, image_size=SIZE)
    assert out["episodes"] == 12 and set(out["per_init"]) == {0, 1, 2}
    assert 0.0 <= out["all_at_k"] <= out["avg"] <= out["best_at_k"] <= 1.0 or out["avg"] == 0.0
    assert success_metrics({0: [True, True], 1: [False, False]}) == {
        "avg": 0.5,
        "successes": 2,
        "avg_ci95": [0.15, 0.85],
        "best_at_k": 0.5,
        "all_at_k": 0.5,
        "init_states": 2,
        "episodes": 4,
    }


# -- action chunks ---------------------------------------------------------------------------


def test_chunked_policy_samples_k_actions_per_decision_and_recomputes_their_logprobs():
    torch.manual_seed(0)
    model = MiniVLA(MiniVLAConfig.tiny(**TINY, action_chunk=3)).eval()
    first, _ = ToyReach().reset(options={"init_state": 0})
    obs = collate([first, {**first, "instruction": "reach right now"}])
    out = model.act(obs, temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert (
        out.actions.shape == (2, 3, 7) and tuple(out.tokens.shape) == (2, 21) and tuple(out.logprobs.shape) == (2, 21)
    )
    assert torch.allclose(model.token_logprobs(obs, out.tokens), out.logprobs, atol=1e-4)
    # chunks round-trip through the tokens (bins of width 2/255; the gripper is binarised)
    chunks = np.random.default_rng(0).uniform(-0.9, 0.9, (4, 3, 7)).astype(np.float32)
    decoded = model.decode(model.encode_actions(chunks))
    assert decoded.shape == (4, 3, 7) and np.abs(decoded[..., :6] - chunks[..., :6]).max() <= 1 / 255 + 1e-6
    assert (decoded[..., 6] == np.where(chunks[..., 6] > 0, 1.0, -1.0)).all()
    with pytest.raises(ValueError, match="action_chunk=3"):
        model.encode_actions(chunks[:, 0])
    with pytest.raises(ValueError, match="action_chunk"):
        MiniVLAConfig.tiny(**TINY, action_chunk=0)


class _ChunkPolicy:
    """Always the same chunk: action k moves x by 0.1 * (k + 1) per env step."""

    def __init__(self, k: int):
        self.k = k

    def act(self, obs, temperature=1.0, generator=None):
        from types import SimpleNamespace

        chunk = np.zeros((1, self.k, 7), np.float32)
        chunk[0, :, 0] = 0.1 * np.arange(1, self.k + 1)
        return SimpleNamespace(
            actions=chunk, tokens=torch.zeros((1, 7 * self.k), dtype=torch.long), logprobs=torch.zeros((1, 7 * self.k))
        )


def test_rollout_executes_a_chunk_open_loop_with_one_row_per_decision():
    env = ToyReach(horizon=13)
    (ep,) = run_group(env, _ChunkPolicy(3), "g", 0, 1, action_repeat=2)
    # decisions at steps 0 and 6 (3 actions x 2 repeats each); step 12 is the graded one
    assert ep.steps == 13 and len(ep.rows) == 2 and ep.token_tensor().shape == (2, 21)
    assert env.states == pytest.approx(np.cumsum([0.0] + [0.01, 0.01, 0.02, 0.02, 0.03, 0.03] * 2).tolist())


def test_receding_horizon_executes_the_first_actions_of_each_chunk_then_decides_again():
    env = ToyReach(horizon=13)
    ep = run_episode(env, _ChunkPolicy(3), {"init_state": 0}, action_repeat=2, execute_actions=1)
    # a decision every 2 steps (0, 2, ..., 10), each executing the chunk's first action only
    assert ep.steps == 13 and len(ep.rows) == 6 and ep.token_tensor().shape == (6, 21)
    assert env.states == pytest.approx(np.cumsum([0.0] + [0.01] * 12).tolist())
    two = ToyReach(horizon=13)
    assert len(run_episode(two, _ChunkPolicy(3), {"init_state": 0}, action_repeat=2, execute_actions=2).rows) == 3
    assert two.states == pytest.approx(np.cumsum([0.0] + [0.01, 0.01, 0.02, 0.02] * 3).tolist())
    for bad in (0, True):
        with pytest.raises(ValueError, match="execute_actions"):
            run_episode(ToyReach(), _ChunkPolicy(3), {"init_state": 0}, execute_actions=bad)


def _instructed_demo(instruction: str, value: float, n: int = 10) -> DemoEpisode:
    rng = np.random.default_rng(0)  # every task shows the same images: only the words differ
    a = np.full((n, 7), value, np.float32)
    a[:, -1] = 1.0
    return DemoEpisode(
        instruction,
        rng.integers(0, 255, (n, SIZE, SIZE, 3), dtype=np.uint8),
        rng.integers(0, 255, (n, SIZE, SIZE, 3), dtype=np.uint8),
        np.zeros((n, 9), np.float32),
        a,
        {"task": instruction},
    )


@pytest.mark.parametrize("chunk", [1, 2])
def test_multitask_sft_conditions_on_the_instruction(tmp_path, chunk):
    tasks = {"put the soup in the basket": 0.6, "put the mug on the plate": -0.6}
    data = DemoDataset([_instructed_demo(text, v) for text, v in tasks.items()])
    config = SFTConfig(
        output_dir=str(tmp_path / "sft"),
        steps=60,
        batch_size=16,
        learning_rate=3e-3,
        warmup_steps=5,
        shift=0,
        tensorboard=False,
        progress=False,
        action_chunk=chunk,
        **TINY,
    )
    result = train_sft(config, data)
    model = MiniVLA.load(result["checkpoint"])
    assert model.config.action_chunk == chunk
    ep = data.episodes[0]
    for text, value in tasks.items():
        obs = {
            "agentview_image": ep.agentview[:1],
            "wrist_image": ep.wrist[:1],
            "proprio": ep.proprio[:1],
            "instruction": [text],
        }
        moves = np.asarray(model.act(obs, temperature=0.0).actions).reshape(-1, 7)[:, :6]
        assert np.sign(moves).tolist() == [[np.sign(value)] * 6] * chunk, (text, moves)
    # the offline frame-error metric agrees: the fitted policy gets every frame of both tasks right
    from agents.vla.__main__ import main

    demos = data.save(tmp_path / "demos.npz")
    report = tmp_path / "frame_errors.json"
    assert main(["frame-errors", "--policy", result["checkpoint"], "--demos", str(demos), "--output", str(report)]) == 0
    errors = json.loads(report.read_text())
    assert errors["overall"] == {"frames": 20, "wrong": 0, "rate": 0.0, "episodes": 2}
    assert sorted(errors["per_task"]) == sorted(tasks)
    assert main(["frame-errors", "--policy", result["checkpoint"]]) == 2  # nothing to score


def test_summary_pools_tasks_with_wilson_intervals_and_refuses_double_counting(tmp_path, capsys):
    from agents.vla.__main__ import main

    def write(name, task, wins, n):
        path = tmp_path / name
        row = {"policy": "ckpt", "task": task, "split": "OOD", "successes": wins, "episodes": n, "avg": wins / n}
        path.write_text(json.dumps({"rows": [row]}))
        return f"sft={path}"

    a, b = write("t0.json", 0, 3, 10), write("t7.json", 7, 7, 10)
    assert main(["summary", "--policy", a, b, "--output", str(tmp_path / "summary.json")]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())["sft"]
    assert [r["task"] for r in summary["per_task"]] == [0, 7]
    (pooled,) = summary["overall"]
    assert (pooled["successes"], pooled["episodes"], pooled["avg"]) == (10, 20, 0.5)
    assert pooled["avg_ci95"] == [0.2993, 0.7007]  # Wilson, n = 20
    assert "| sft | all | OOD | 0.500 | 0.299-0.701 |" in capsys.readouterr().out
    with pytest.raises(ValueError, match="task 0 split OOD appears twice"):
        main(["summary", "--policy", a, a])
    assert main(["summary", "--policy", "no-equals-sign"]) == 2


def test_expert_move_timeout_counts_only_steps_near_the_goal_when_a_radius_is_set():
    import itertools

    from agents.vla.expert import ExpertConfig, ScriptedExpert

    expert = object.__new__(ScriptedExpert)  # the plan logic alone, no simulator
    where = [np.array([0.5, 0.0, 0.0])]
    expert._eef_pos = lambda: where[0]
    goal = lambda: np.zeros(3)  # noqa: E731
    expert.config = ExpertConfig(phase_timeout=3)
    assert len(list(expert._move(goal, -1.0, "descend"))) == 3  # the demonstrating expert: every step counts
    expert.config = ExpertConfig(phase_timeout=3, timeout_radius=0.05)
    assert len(list(itertools.islice(expert._move(goal, -1.0, "descend"), 50))) == 50  # far off: keep moving
    where[0] = np.array([0.02, 0.0, 0.0])
    assert len(list(expert._move(goal, -1.0, "descend"))) == 3 and expert.phase == "descend"  # near: time out
    where[0] = np.array([0.005, 0.0, 0.0])
    assert list(expert._move(goal, -1.0, "descend")) == []  # within tolerance: done
