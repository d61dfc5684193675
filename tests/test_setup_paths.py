"""The one way to do each setup step: vector envs and their info policy, the stack builder,
CLIs derived from config dataclasses, the policy / world-model loaders."""

import argparse
import dataclasses

import gymnasium as gym
import numpy as np
import pytest

import wmrl_envs  # noqa: F401  (registers the env ids)
from wmrl_envs.config_cli import add_config_arguments, build_config, field_doc
from wmrl_envs.vector import known_info, make_vector_env, sub_info
from wmrl_envs.world_models import CodeOutcomeModel
from wrappers import (
    STACKS,
    AnchorWrapper,
    CalibrationConfig,
    CalibrationWrapper,
    VectorAnchorWrapper,
    VectorCalibrationWrapper,
    VectorWorldModelWrapper,
    WorldModelWrapper,
    build_stack,
    find_layer,
    require_layer,
)

MALFORMED = "no code block here"  # graded for free (malformed, 0.0): no sandbox run
NO_CODE = "REQUEST_INFO: metric"  # no grading at all: the step's outcome is unknown


# ------------------------------------------------------------------ info policy
def test_envs_leave_unknown_values_out_of_info():
    env = gym.make("wmrl/AutoResearch-v0", split="train", max_turns=1)
    _, info = env.reset(options={"task": "wage"})  # a regression task: no n_classes, no classes
    assert "n_classes" not in info and "classes" not in info and "group_id" not in info
    _, _, terminated, _, info = env.step(NO_CODE)
    assert terminated and "outcome" not in info and "trajectory_reward" not in info  # unknown, not 0
    assert info["graded"] is False and info["turn"] == 0


def test_plain_make_vec_batches_mixed_infos_without_loss():
    """Regression next to classification, unknown next to known rewards: what used to raise
    TypeError (None into an int array) or become NaN (None into a float array)."""
    env = make_vector_env("wmrl/AutoResearch-v0", 2, split="train", max_turns=1, tasks=["titanic", "wage"])
    seed = next(s for s in range(50) if len(set(env.reset(seed=s)[1]["task_id"])) == 2)
    _, infos = env.reset(seed=seed)
    classification = infos["task_id"] == "titanic"
    assert infos["n_classes"].dtype.kind == "i" and list(infos["_n_classes"]) == list(classification)
    env.close()
    env = make_vector_env("wmrl/AutoResearch-v0", 2, split="train", max_turns=1, tasks=["titanic"])
    _, infos = env.reset(seed=0)
    _, _, terminated, _, infos = env.step(np.array([MALFORMED, NO_CODE], dtype=object))
    final = infos["final_info"]
    assert terminated.all()
    assert final["trajectory_reward"].dtype == np.float64 and list(final["_trajectory_reward"]) == [True, False]
    assert sub_info(final, 0)["trajectory_reward"] == 0.0 and "trajectory_reward" not in sub_info(final, 1)
    env.close()


def test_known_info_and_sub_info():
    assert known_info({"a": None, "b": 0.0, "c": {"d": None, "e": 1}}) == {"b": 0.0, "c": {"e": 1}}
    infos = {
        "x": np.array([1.5, 0.0]),
        "_x": np.array([True, False]),
        "n": {"y": np.array([1, 2]), "_y": np.array([False, True])},
    }
    assert sub_info(infos, 0) == {"x": 1.5, "n": {}} and sub_info(infos, 1) == {"n": {"y": 2}}
    assert sub_info(infos, 0, keys=("n",)) == {"n": {}}


def test_make_vector_env_rejects_bad_arguments():
    with pytest.raises(ValueError, match="num_envs must be >= 1"):
        make_vector_env("wmrl/AutoResearch-v0", 0)
    with pytest.raises(ValueError, match="vectorization must be one of"):
        make_vector_env("wmrl/AutoResearch-v0", 2, vectorization="threads")
    with pytest.raises(ValueError, match="ray_options apply to vectorization='ray' only, not 'sync'"):
        make_vector_env("wmrl/AutoResearch-v0", 2, ray_options={"num_cpus": 1})


# ------------------------------------------------------------------ the stack builder
@pytest.fixture(scope="module")
def world_model():
    return CodeOutcomeModel.load_default()


@pytest.mark.parametrize("vector", [False, True])
def test_build_stack_composes_each_kind_in_order(world_model, vector):
    def base():
        if vector:
            return make_vector_env("wmrl/AutoResearch-v0", 4, split="train")
        return gym.make("wmrl/AutoResearch-v0", split="train")

    forms = (
        (VectorWorldModelWrapper, VectorAnchorWrapper, VectorCalibrationWrapper)
        if vector
        else (WorldModelWrapper, AnchorWrapper, CalibrationWrapper)
    )
    assert build_stack(base(), "real") is not None and find_layer(build_stack(base(), "real"), forms[0]) is None
    real = build_stack(base(), "real", world_model)
    assert isinstance(real, forms[0]) and real.mode == "env" if not vector else isinstance(real, forms[0])
    assert isinstance(build_stack(base(), "wm", world_model), forms[0])
    stack = build_stack(
        base(), "wmrl", world_model, anchor_fraction=0.5, seed=3, calibration=CalibrationConfig(start_pairs=8)
    )
    assert [type(layer) for layer in (stack, stack.env, stack.env.env)] == list(reversed(forms))
    assert (
        stack.debiaser.start_pairs == 8 and require_layer(stack, forms[1], needed_by="test").scheduler.fraction == 0.5
    )
    with pytest.raises(ValueError, match="needs a world model"):
        build_stack(base(), "wmrl")
    with pytest.raises(ValueError, match="unknown stack 'both'"):
        build_stack(base(), "both", world_model)
    assert STACKS == ("real", "wm", "wmrl")


def test_require_layer_names_who_needed_it():
    env = gym.make("wmrl/AutoResearch-v0", split="train")
    with pytest.raises(TypeError, match="the trainer needs a AnchorWrapper"):
        require_layer(env, AnchorWrapper, needed_by="the trainer")


# ------------------------------------------------------------------ CLIs from config dataclasses
@dataclasses.dataclass
class _Knobs:
    """Demo knobs.

    Attributes:
        steps: training steps,
            continued on a second line.
        lr / lr_high: step sizes.
        tags: labels.
        limit: an optional cap.
        on: a switch.
    """

    steps: int = 3
    lr: float = 0.1
    lr_high: float | None = None
    tags: tuple[str, ...] = ()
    limit: int | None = 5
    on: bool = False


def test_every_field_is_a_documented_flag_with_its_default():
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, _Knobs)
    add_config_arguments(parser, CalibrationConfig, section="calibration")
    text = parser.format_help()
    assert "training steps, continued on a second line. (default: 3)" in " ".join(text.split())
    assert "--lr-high" in text and "--calibration-start-pairs" in text
    assert field_doc(_Knobs, "lr_high") == "step sizes."
    args = parser.parse_args(
        ["--steps", "7", "--limit", "none", "--on", "yes", "--tags", "a", "b", "--calibration-start-pairs", "4"]
    )
    assert build_config(_Knobs, {"lr": 0.5}, args) == _Knobs(steps=7, lr=0.5, tags=("a", "b"), limit=None, on=True)
    assert build_config(CalibrationConfig, {"refit_every": 2}, args, section="calibration") == CalibrationConfig(
        start_pairs=4, refit_every=2
    )
    with pytest.raises(ValueError, match=r"unknown \[calibration\] CalibrationConfig settings \['start'\]"):
        build_config(CalibrationConfig, {"start": 1}, args, section="calibration")
    with pytest.raises(SystemExit):
        parser.parse_args(["--on", "maybe"])


def test_agent_cli_flags_cover_every_trainer_field():
    from agents.llm.__main__ import EvalConfig, TrainRun, _parser
    from agents.llm.trainer import GRPOConfig

    train = next(a for a in _parser()._subparsers._group_actions[0].choices.values() if a.prog.endswith("train"))  # noqa: SLF001
    flags = {opt for action in train._actions for opt in action.option_strings}  # noqa: SLF001
    for cls, prefix in (
        (TrainRun, "--"),
        (GRPOConfig, "--"),
        (CalibrationConfig, "--calibration-"),
        (EvalConfig, "--eval-"),
    ):
        for f in dataclasses.fields(cls):
            assert prefix + f.name.replace("_", "-") in flags, (cls.__name__, f.name)
            assert field_doc(cls, f.name), f"{cls.__name__}.{f.name} has no documentation"


def test_agent_cli_refuses_a_bad_config_in_one_line(tmp_path, capsys):
    from agents.llm.__main__ import main

    bad = tmp_path / "c.toml"
    bad.write_text("total_stepz = 3\n")
    assert main(["train", "--config", str(bad), "--output-dir", str(tmp_path / "out")]) == 2
    assert "bad configuration: unknown GRPOConfig settings ['total_stepz']" in capsys.readouterr().err


# ------------------------------------------------------------------ loaders
def test_load_policy_checks_the_checkpoint_before_loading(tmp_path):
    pytest.importorskip("transformers")
    from agents.llm.loading import load_policy, load_world_model

    with pytest.raises(FileNotFoundError, match="is not a trainer checkpoint"):
        load_policy("tiny", checkpoint=tmp_path)
    with pytest.raises(FileNotFoundError, match="holds no CodeOutcomeModel"):
        load_world_model(str(tmp_path))
    assert isinstance(load_world_model("default"), CodeOutcomeModel)
