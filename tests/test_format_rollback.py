"""The GRPO loop rolls a run back to the last policy that wrote its format when it collapses
off it (agents.grpo.rollback, GRPOLoopConfig.max_rollbacks)."""

import json
import tempfile
from types import SimpleNamespace

import pytest
import torch

from agents.grpo import FormatRollback, GRPOLoopConfig, NoLearningSignalWarning, train


class _CollapsingAgent:
    """A policy with one weight ``w``: while ``w < 3`` a group holds one valid reply (reward 1)
    and one malformed (0); at ``w >= 3`` every reply is malformed, so no group has a signal and
    GRPO cannot move it back. Each update adds 1 to ``w``, so the third update collapses it."""

    def __init__(self, config):
        self.config, self.env = config, None
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.weights_seen: list[float] = []

    def parameters(self):
        return [self.w]

    def select(self, step, rng):
        return [(f"g{step}", None)]

    def collect(self, groups, rng):
        self.weights_seen.append(float(self.w.detach()))
        rewards = [0.0, 0.0] if float(self.w.detach()) >= 3 else [1.0, 0.0]
        episodes = [
            SimpleNamespace(group_id=groups[0][0], reward=r, source=None, anchor=False, graded_steps=0, final_info={})
            for r in rewards
        ]
        return episodes, {}

    def update(self, episodes, advantages, optimizer, rng):
        self.w.grad = torch.zeros(1)
        optimizer.step()  # a zero gradient: Adam counts the step and moves nothing
        with torch.no_grad():
            self.w.add_(1.0)
        return {}

    def step_metrics(self, episodes):
        valid = sum(e.reward == 1.0 for e in episodes) / len(episodes)
        return {"reward/valid_rate": valid, "reward/malformed_rate": 1.0 - valid}

    def save_policy(self, directory):
        torch.save({"w": self.w.detach().clone()}, directory / "policy.pt")

    def load_policy(self, directory):
        with torch.no_grad():
            self.w.copy_(torch.load(directory / "policy.pt")["w"])


def _config(tmp_path=None, **kw):
    return GRPOLoopConfig(
        groups_per_step=1, group_size=2, total_steps=12, learning_rate=1e-3, progress=False, tensorboard=False,
        no_signal_patience=2, exploitation_guard=False, output_dir=str(tmp_path) if tmp_path else None, **kw,
    )  # fmt: skip


def test_a_collapse_off_the_format_is_rolled_back_to_the_last_mostly_valid_policy(tmp_path):
    agent = _CollapsingAgent(_config(tmp_path / "run", max_rollbacks=2))
    with pytest.warns(NoLearningSignalWarning, match="collapsed off the scaffold's format"):
        result = train(agent)
    # steps 1-3 healthy (w 0, 1, 2), 4-5 collapsed, rolled back at 5 to step 3's policy (w 2, saved
    # before its update); 6 healthy again, 7-8 collapsed, rolled back at 8; 10-11 collapsed with no
    # rollback left, so 12 stays collapsed
    assert agent.weights_seen == [0, 1, 2, 3, 3, 2, 3, 3, 2, 3, 3, 3]
    assert len(result.rollbacks) == 2
    assert "back to step 3 (50% valid replies), learning rate 0.001 -> 0.0005" in result.rollbacks[0]
    assert "back to step 6" in result.rollbacks[1] and "0.0005 -> 0.00025" in result.rollbacks[1]
    lr = {h["step"]: h["train/learning_rate"] for h in result.history}
    assert lr[4] == 1e-3 and lr[5] == 5e-4 and lr[8] == 2.5e-4 and lr[12] == 2.5e-4
    assert [h["train/rollbacks"] for h in result.history][4:9] == [1, 1, 1, 2, 2]
    assert sum("Rolled back" in w for w in result.warnings) == 2 and "Rolled back" not in result.warnings[-1]
    # a warning whose collapse was rolled back says so instead of advising a resume by hand
    assert not any("Rolled back" in w and "earlier checkpoint" in w for w in result.warnings)
    assert "earlier checkpoint" in result.warnings[-1]
    # the count and the learning rate survive a resume; the snapshot stays beside the checkpoint
    assert json.loads((tmp_path / "run" / "checkpoint" / "trainer.json").read_text())["rollbacks"] == 2
    assert json.loads((tmp_path / "run" / "last_valid_policy" / "snapshot.json").read_text())["step"] == 9


def test_without_rollbacks_the_collapse_stays():
    agent = _CollapsingAgent(_config(max_rollbacks=0))
    with pytest.warns(NoLearningSignalWarning, match="resume from an earlier checkpoint"):
        result = train(agent)
    assert agent.weights_seen == [0, 1, 2] + [3] * 9 and result.rollbacks == []
    assert result.history[-1]["train/learning_rate"] == 1e-3


def test_a_rollback_that_never_saves_leaves_no_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where a temporary snapshot would go
    w = torch.nn.Parameter(torch.ones(1))
    off = FormatRollback(None, max_rollbacks=0)
    assert not off.observe(1, {"reward/valid_rate": 1.0}, SimpleNamespace(), torch.optim.AdamW([w]))
    assert off.saved is None and not list(tmp_path.iterdir())
    off.close()


def test_rollback_settings_are_checked():
    with pytest.raises(ValueError, match="max_rollbacks"):
        _config(max_rollbacks=-1)
    with pytest.raises(ValueError, match="rollback_lr_factor"):
        _config(rollback_lr_factor=0.0)
    with pytest.raises(ValueError, match="warmup_steps"):
        _config(warmup_steps=-1)
    with pytest.raises(ValueError, match="healthy_valid_rate"):
        FormatRollback(None, healthy_valid_rate=0.0)


def test_warmup_raises_the_learning_rate_linearly_over_optimiser_steps():
    with pytest.warns(NoLearningSignalWarning):
        result = train(_CollapsingAgent(_config(max_rollbacks=0, warmup_steps=4)))
    lr = [h["train/learning_rate"] for h in result.history]
    # three updates (steps 1-3) at 1/4, 2/4, 3/4 of the rate; from then on the full rate
    assert lr[:5] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3])
