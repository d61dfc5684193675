"""A world model that learns from its anchors (agents.grpo.WorldModelUpdater), on the toy stack."""

from __future__ import annotations

import json

import numpy as np
import pytest
from wrapper_toys import SyntheticWorldModel, ToySeamEnv, training_steps

from agents.grpo import WorldModelUpdater
from wrappers import StackHandle, build_stack


class LearningWorldModel(SyntheticWorldModel):
    """The synthetic world model plus ``update``: a least-squares line from its own (biased)
    score to the true score over every record it has been given, applied from then on."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seen: list[tuple[float, float]] = []
        self.line = (1.0, 0.0)

    def score(self, task, action, turn=0):
        slope, intercept = self.line
        return float(np.clip(slope * super().score(task, action, turn) + intercept, 0.0, 1.0))

    def update(self, records):
        for r in records:
            raw = SyntheticWorldModel.score(self, r.context["task_id"], int(r.code), r.context.get("turn", 0))
            self.seen.append((raw, r.outcome.score))
        x, y = np.array(self.seen).T
        self.line = tuple(np.polyfit(x, y, 1))
        return self


def _run(env, updater, steps, start=0):
    for step in range(start, start + steps):
        for _ in training_steps(env, [step], groups=4, size=4, seed=1):
            pass
        updater(step + 1, {})


def test_refits_on_anchor_outcomes_at_step_boundaries_and_held_back_fidelity_improves():
    env = build_stack(ToySeamEnv(n_actions=64), "wmrl", LearningWorldModel(noise=0.0), anchor_fraction=0.5)
    updater = WorldModelUpdater(env, every=16, holdout=0.25, background=False)
    initial = StackHandle(env).world_model
    _run(env, updater, 12)
    assert len(updater.fitted) + len(updater.held_back) == 12 * 2 * 4  # every anchor member, labelled
    assert 0 < len(updater.held_back) < len(updater.fitted)
    assert updater.history and StackHandle(env).world_model is not initial  # swapped in, a copy
    assert initial.line == (1.0, 0.0)  # the run's initial model was never touched
    last = updater.history[-1]
    assert last["updated"]["mae"] < last["initial"]["mae"] / 3  # the paper bias, learned from the anchors
    assert last["held_back"] == len(updater.held_back) and last["fit_cpu_s"] >= 0.0
    # held-back scripts are never fitted on: the model saw exactly the fitted side
    assert len(StackHandle(env).world_model.seen) == updater.in_model <= len(updater.fitted)


def test_background_refit_is_swapped_in_only_at_a_step_boundary():
    env = build_stack(ToySeamEnv(n_actions=64), "wmrl", LearningWorldModel(noise=0.0), anchor_fraction=1.0)
    updater = WorldModelUpdater(env, every=8, holdout=0.0, background=True)
    before = StackHandle(env).world_model
    _run(env, updater, 1)  # 16 anchor records: a refit starts at this boundary
    updater.wait()
    assert StackHandle(env).world_model is before and not updater.history  # done, not yet swapped
    _run(env, updater, 1, start=1)
    assert StackHandle(env).world_model is not before and len(updater.history) == 1


def test_updater_state_resumes_with_the_same_records_and_refits_them():
    env = build_stack(ToySeamEnv(n_actions=64), "wmrl", LearningWorldModel(noise=0.0), anchor_fraction=0.5)
    updater = WorldModelUpdater(env, every=1, holdout=0.25, background=False)  # refit at every boundary
    _run(env, updater, 10)
    assert updater.in_model == len(updater.fitted)
    saved = json.loads(json.dumps(updater.state_dict()))
    fresh_env = build_stack(ToySeamEnv(n_actions=64), "wmrl", LearningWorldModel(noise=0.0), anchor_fraction=0.5)
    resumed = WorldModelUpdater(fresh_env, every=1, holdout=0.25, background=False)
    resumed.load_state_dict(saved)
    assert resumed.in_model == 0 and resumed.history == updater.history
    resumed(11, {})  # the first boundary refits the restored initial model on every saved record
    assert resumed.in_model == len(updater.fitted)
    assert StackHandle(fresh_env).world_model.line == pytest.approx(StackHandle(env).world_model.line, abs=1e-12)


def test_updater_needs_anchors_and_an_updatable_model():
    with pytest.raises(TypeError, match="no update"):
        WorldModelUpdater(build_stack(ToySeamEnv(), "wmrl", SyntheticWorldModel()))
    with pytest.raises(TypeError, match="no anchor groups"):
        WorldModelUpdater(build_stack(ToySeamEnv(), "wm", LearningWorldModel()))


def test_a_background_refit_is_charged_to_the_process_cpu_clock():
    """The speedup budget counts process CPU: a refit in the updater's thread is in it."""
    import time

    class SlowLearner(LearningWorldModel):
        def update(self, records):
            t0 = time.thread_time()
            while time.thread_time() - t0 < 0.3:  # CPU work, not a sleep
                pass
            return super().update(records)

    env = build_stack(ToySeamEnv(n_actions=64), "wmrl", SlowLearner(noise=0.0), anchor_fraction=1.0)
    updater = WorldModelUpdater(env, every=8, holdout=0.0, background=True)
    cpu0 = time.process_time()
    _run(env, updater, 1)
    updater.wait()
    _run(env, updater, 1, start=1)
    assert updater.fit_seconds >= 0.3 and time.process_time() - cpu0 >= updater.fit_seconds


def test_refits_a_model_behind_the_benchmarks_script_counter_and_keeps_its_count():
    # The speedup benchmark grades through ScriptCounter, a proxy with __getattr__; a deep copy
    # of it recursed forever (RecursionError in the background refit of a full stress run).
    from benchmarks.speedup_accounting import ScriptCounter

    counter = ScriptCounter(LearningWorldModel(noise=0.0))
    env = build_stack(ToySeamEnv(n_actions=64), "wmrl", counter, anchor_fraction=0.5)
    updater = WorldModelUpdater(env, every=16, holdout=0.25, background=False)
    _run(env, updater, 6)
    refitted = StackHandle(env).world_model
    assert isinstance(refitted, ScriptCounter) and refitted is not counter and updater.history
    assert refitted.model.seen and not counter.model.seen  # the copy learned, the original did not
    before = sum(len(s) for s in counter.scripts.values())
    _run(env, updater, 6, start=6)
    assert refitted.scripts is counter.scripts  # what the copy grades lands in the arm's count
    assert sum(len(s) for s in counter.scripts.values()) > before
