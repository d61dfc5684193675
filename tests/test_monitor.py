"""The world-model exploitation monitor and the guard acting on it."""

import gymnasium as gym
import pytest

import wmrl_envs  # noqa: F401  (registers the env ids)
from wmrl_envs.world_models import CodeOutcomeModel
from wrappers import StackHandle, build_stack
from wrappers.parts.monitor import anchor_group_stats

pytest.importorskip("torch")
from agents.grpo import ExploitationGuard  # noqa: E402


def test_anchor_group_stats_reads_only_anchor_groups_and_known_scores():
    results = [
        {"anchor": True, "calibrated": [0.9, 0.5, None], "true": [0.5, 0.3, 0.2]},  # gap +0.4, +0.2
        {"anchor": True, "calibrated": [0.2, 0.6], "true": [0.6, 0.2]},  # reversed ranking
        {"anchor": False, "calibrated": [1.0, 0.0], "true": [0.0, 1.0]},  # not an anchor: ignored
        {"anchor": True, "calibrated": [0.5, 0.5], "true": [0.1, 0.9]},  # constant WM side: no rank
    ]
    stats = anchor_group_stats(results)
    assert stats["anchor_groups"] == 3
    assert stats["informative_groups"] == 2  # spread on both sides: the first two
    assert (stats["flat_calibrated_groups"], stats["flat_true_groups"], stats["single_pair_groups"]) == (1, 0, 0)
    why = anchor_group_stats(
        [
            {"anchor": True, "calibrated": [0.56, 0.58], "true": [0.1, 0.1]},  # two scripts, both timed out
            {"anchor": True, "calibrated": [0.9, 0.9], "true": [0.9, 0.9]},  # flat on both sides
            {"anchor": True, "calibrated": [0.7, None], "true": [0.6, 0.2]},  # one known pair
        ]
    )
    assert (why["anchor_groups"], why["informative_groups"]) == (3, 0)
    assert (why["flat_true_groups"], why["flat_calibrated_groups"], why["single_pair_groups"]) == (2, 1, 1)
    assert stats["gap"] == pytest.approx((0.4 + 0.2 + -0.4 + 0.4 + 0.4 - 0.4) / 6)
    assert stats["rank_agreement"] == pytest.approx((1.0 + -1.0) / 2)
    assert anchor_group_stats([]) == {
        "gap": None,
        "rank_agreement": None,
        "anchor_groups": 0,
        "informative_groups": 0,
        "flat_true_groups": 0,
        "flat_calibrated_groups": 0,
        "single_pair_groups": 0,
        "unknown_true": 0,
        "grader_failure_rate": None,
    }


def test_unknown_real_outcomes_on_anchor_groups_are_counted_not_hidden():
    # {honest script, strong-looking script whose real run the grader could not finish}:
    # the unknown one is excluded from the gap (unknown is not 0) but counted and rated.
    group = {"anchor": True, "calibrated": [0.55, 0.95], "true": [0.6, None]}
    stats = anchor_group_stats([group, {"anchor": False, "calibrated": [0.9], "true": [None]}])
    assert stats["gap"] == pytest.approx(-0.05) and stats["unknown_true"] == 1
    assert stats["grader_failure_rate"] == pytest.approx(0.5)  # non-anchor groups do not count


def test_guard_acts_on_grader_failures(stack, capsys):
    guard = ExploitationGuard(stack, max_gap=0.2, action="stop", window=2)  # failure-rate threshold: default 0.25
    assert guard(1, {"monitor/gap": -0.05, "monitor/grader_failure_rate": 0.1}) is False
    assert guard(2, {"monitor/gap": -0.05, "monitor/grader_failure_rate": 0.5}) is True  # mean 0.3 > 0.25
    assert "real outcome of 30% of anchor members is unknown" in capsys.readouterr().out


@pytest.fixture
def stack():
    env = build_stack(
        gym.make("wmrl/AutoResearch-v0", split="train"), "wmrl", CodeOutcomeModel.load_default(), anchor_fraction=0.1
    )
    yield env
    env.close()


def test_guard_raises_the_anchor_fraction_on_a_smoothed_gap(stack, capsys):
    guard = ExploitationGuard(stack, max_gap=0.2, action="raise", factor=2.0, max_fraction=0.3, window=2)
    assert guard(1, {"monitor/gap": 0.3}) is False and guard.handle.anchor_fraction == pytest.approx(0.2)
    assert "anchor fraction 0.1 -> 0.2" in capsys.readouterr().out
    assert guard(2, {"monitor/gap": 0.1}) is False and guard.handle.anchor_fraction == pytest.approx(
        0.2
    )  # fresh window: 0.1 < 0.2
    assert guard(3, {"monitor/gap": 0.5}) is False and guard.handle.anchor_fraction == pytest.approx(
        0.3
    )  # mean 0.3, capped
    assert guard(4, {"monitor/gap": None}) is False  # steps without anchor groups change nothing
    assert [e["fraction"] for e in guard.events] == [pytest.approx(0.2), pytest.approx(0.3)]


def test_guard_stops_with_a_message(stack, capsys):
    guard = ExploitationGuard(stack, min_rank_agreement=0.5, action="stop")
    assert guard(1, {"monitor/rank_agreement": 0.8}) is False
    assert guard(2, {"monitor/rank_agreement": -0.4}) is True
    assert "rank agreement on anchor groups fell to 0.200" in capsys.readouterr().out


def test_guard_needs_an_anchor_layer_and_a_threshold(stack):
    with pytest.raises(TypeError, match="needs an AnchorWrapper"):
        ExploitationGuard(gym.make("wmrl/AutoResearch-v0", split="train"), max_gap=0.1)
    with pytest.raises(ValueError, match="max_gap, min_rank_agreement and/or max_grader_failure_rate"):
        ExploitationGuard(stack, max_grader_failure_rate=None)
    with pytest.raises(ValueError, match="action must be"):
        ExploitationGuard(stack, max_gap=0.1, action="panic")


def test_escalating_guard_raises_then_stops_and_waits_for_min_steps(stack, capsys):
    guard = ExploitationGuard(stack, max_gap=0.2, action="escalate", max_fraction=0.2, window=2, min_steps=2)
    assert guard(1, {"monitor/gap": 0.9}) is False and guard.handle.anchor_fraction == pytest.approx(0.1)  # one step
    assert guard(2, {"monitor/gap": 0.9}) is False and guard.handle.anchor_fraction == pytest.approx(0.2)
    assert guard(3, {"monitor/gap": 0.9}) is False  # a fresh window after the raise: one step again
    assert guard(4, {"monitor/gap": 0.9}) is True  # at the maximum share and still over: stop
    assert [e["action"] for e in guard.events] == ["raise", "stop"]
    with pytest.raises(ValueError, match="min_steps"):
        ExploitationGuard(stack, max_gap=0.1, window=2, min_steps=3)


class _GapAgent:
    """A GRPO agent whose every step is one anchor group the world model overrates by 0.6."""

    def __init__(self, env, config):
        self.env, self.config = env, config

    def parameters(self):
        import torch

        return [torch.nn.Parameter(torch.zeros(1))]

    def select(self, step, rng):
        return [(f"s{step}", None)]

    def collect(self, groups, rng):
        from types import SimpleNamespace

        gid = groups[0][0]
        result = {"group_id": gid, "anchor": True, "calibrated": [0.9, 0.8], "true": [0.3, 0.2]}
        return [
            SimpleNamespace(group_id=gid, reward=r, source="env", anchor=True, graded_steps=1,
                            final_info={"group_result": result})
            for r in (0.3, 0.2)
        ], {}  # fmt: skip

    def update(self, episodes, advantages, optimizer, rng):
        return {}

    def step_metrics(self, episodes):
        return {}

    def save_policy(self, directory):
        pass

    def load_policy(self, directory):
        pass


@pytest.mark.filterwarnings("ignore::agents.grpo.diagnostics.CorrectionsIdleWarning")  # the map is not the point
def test_train_guards_a_wmrl_stack_by_default():
    from wrapper_toys import SyntheticWorldModel, ToySeamEnv

    from agents.grpo import DEFAULT_GUARD, GRPOLoopConfig, train

    env = build_stack(ToySeamEnv(), "wmrl", SyntheticWorldModel(), anchor_fraction=0.1)
    config = GRPOLoopConfig(total_steps=100, progress=False, tensorboard=False, groups_per_step=1, group_size=2)
    result = train(_GapAgent(env, config))
    window = DEFAULT_GUARD["min_steps"]
    # 0.1 -> 0.2 -> 0.4 -> 0.5 (each after a fresh window), then stopped at the maximum
    assert result.last_step == 4 * window and StackHandle(env).anchor_fraction == pytest.approx(0.5)
    assert len(result.warnings) == 4 and "stop" in result.warnings[-1] and "exceed real scores" in result.warnings[-1]
    env = build_stack(ToySeamEnv(), "wmrl", SyntheticWorldModel(), anchor_fraction=0.1)
    off = GRPOLoopConfig(total_steps=3 * window, progress=False, tensorboard=False, groups_per_step=1, group_size=2,
                         exploitation_guard=False)  # fmt: skip
    assert train(_GapAgent(env, off)).last_step == 3 * window and StackHandle(env).anchor_fraction == 0.1


def test_anchor_schedule_decays_while_the_calibration_holds_and_rises_when_the_gap_opens(stack):
    import json

    from agents.grpo import AnchorSchedule

    schedule = AnchorSchedule(stack, floor=0.05, ceiling=0.4, decay=0.5, window=4, tolerance=0.02, max_gap=0.1)
    handle = StackHandle(stack)
    for step in range(1, 9):  # small, steady gaps: the calibration holds -> 0.1 -> 0.05 (the floor)
        schedule(step, {"monitor/gap": 0.005 if step % 2 else -0.005})
    assert handle.anchor_fraction == pytest.approx(0.05) and [e["action"] for e in schedule.events] == ["decay"]
    for step in range(9, 13):  # steps without anchor groups change nothing
        schedule(step, {"monitor/gap": None})
    for step in range(13, 17):  # noisy gaps around 0: neither decision
        schedule(step, {"monitor/gap": 0.3 if step % 2 else -0.3})
    assert handle.anchor_fraction == pytest.approx(0.05) and len(schedule.events) == 1
    for step in range(17, 25):  # a clear, steady over-rating: rise, twice as fast as the decay
        schedule(step, {"monitor/gap": 0.2})
    assert [e["action"] for e in schedule.events] == ["decay", "rise", "rise"]
    assert handle.anchor_fraction == pytest.approx(0.4)  # 0.05 / 0.25 = 0.2, then capped at the ceiling
    again = AnchorSchedule(stack, floor=0.05, ceiling=0.4, decay=0.5, window=4, tolerance=0.02, max_gap=0.1)
    again.load_state_dict(json.loads(json.dumps(schedule.state_dict())))
    assert again.events == schedule.events and again.gaps == schedule.gaps
    with pytest.raises(ValueError, match="floor"):
        AnchorSchedule(stack, floor=0.6, ceiling=0.5)
