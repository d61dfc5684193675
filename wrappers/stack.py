"""Build a training stack in one call: real execution, raw world model, or WMRL.

The one place that composes the wrappers in their fixed order (outermost first)::

    CalibrationWrapper(AnchorWrapper(WorldModelWrapper(env, world_model)))

for a single ``gymnasium.Env`` or, with the ``Vector*`` forms, a ``VectorEnv``.

Functions: :func:`build_stack`. Constant: :data:`STACKS`.

>>> import wmrl_envs
>>> from wmrl_envs.vector import make_vector_env
>>> from wmrl_envs.world_models import CodeOutcomeModel
>>> env = build_stack(make_vector_env("wmrl/AutoResearch-v0", 4, split="train"), "wmrl", CodeOutcomeModel.load_default())
>>> type(env).__name__, type(env.env).__name__, type(env.env.env).__name__
('VectorCalibrationWrapper', 'VectorAnchorWrapper', 'VectorWorldModelWrapper')
>>> env.close()
"""

from __future__ import annotations

from typing import Any

from gymnasium.vector import VectorEnv

from wrappers.anchor import AnchorWrapper, VectorAnchorWrapper
from wrappers.calibration import CalibrationConfig, CalibrationWrapper, VectorCalibrationWrapper
from wrappers.world_model import VectorWorldModelWrapper, WorldModelWrapper

__all__ = ["build_stack", "STACKS"]

#: Stack kinds: ``real`` (GRPO on real execution), ``wm`` (GRPO on the raw world model),
#: ``wmrl`` (world model + anchor groups + Online Debiasing + Inverse-Variance Denoising).
STACKS = ("real", "wm", "wmrl")


def build_stack(
    env: Any,
    kind: str = "wmrl",
    world_model: Any = None,
    *,
    anchor_fraction: float = 0.10,
    anchor_min_per_step: int = 1,
    seed: int = 0,
    calibration: CalibrationConfig | None = None,
    anchor_overlap: bool = False,
    anchor_selection: str = "random",
    anchor_keep_share: bool = True,
) -> Any:
    """Wrap ``env`` (an OutcomeSeam env, single or vector) as the stack ``kind``.

    Args:
        env: the env or vector env to wrap.
        kind: one of :data:`STACKS`.
        world_model: required for ``wm`` and ``wmrl``. For ``real`` it is optional: given,
            the env is wrapped in ``WorldModelWrapper(mode="env")`` (real grading only), so
            real executions are counted by the same counter as in the other stacks.
        anchor_fraction / anchor_min_per_step / seed: the ``AnchorWrapper``'s target share
            of anchor groups, per-step floor and anchor-choice seed (``wmrl`` only).
        calibration: the ``CalibrationWrapper``'s settings (default: the paper's constants).
        anchor_overlap: grade anchor groups for real in the background, overlapping the rest
            of the step (``AnchorWrapper(overlap=True)``; ``wmrl`` only; a single env or a
            ``SyncVectorEnv``).
        anchor_selection: ``"random"`` (the paper's), ``"informative"`` (decided after the
            members' first actions, among groups with distinct scripts) or ``"least-confident"``
            (the same, least confident first); the last two on a vector ``wmrl`` stack only
            (see :class:`~wrappers.anchor.VectorAnchorWrapper`).
        anchor_keep_share: with the last two, grade one-script groups for real when a step
            has too few others to meet its share (``VectorAnchorWrapper(keep_share=...)``).
    """
    if kind not in STACKS:
        raise ValueError(f"unknown stack {kind!r}; choose from {STACKS}")
    if world_model is None:
        if kind != "real":
            raise ValueError(f"stack {kind!r} needs a world model")
        return env
    vector = isinstance(env, VectorEnv)
    if anchor_selection != "random" and not (vector and kind == "wmrl"):
        raise ValueError(
            f"anchor_selection={anchor_selection!r} needs the wmrl stack on a vector env (it sees a group's members "
            f"step together); got kind={kind!r} on a {'vector' if vector else 'single'} env"
        )
    world, calibrate = (
        (VectorWorldModelWrapper, VectorCalibrationWrapper) if vector else (WorldModelWrapper, CalibrationWrapper)
    )
    env = world(env, world_model, mode="env" if kind == "real" else "wm")
    if kind in ("real", "wm"):
        return env
    if vector:  # only the vector form sees a group's members step together (informative selection)
        env = VectorAnchorWrapper(
            env,
            anchor_fraction,
            anchor_min_per_step,
            seed=seed,
            overlap=anchor_overlap,
            selection=anchor_selection,
            keep_share=anchor_keep_share,
        )
    else:
        env = AnchorWrapper(env, anchor_fraction, anchor_min_per_step, seed=seed, overlap=anchor_overlap)
    return calibrate(env, calibration)
