"""Calibration of world-model rewards from anchor groups: Online Debiasing and
Inverse-Variance Denoising (the paper's two corrections).

The wrapper installs an :class:`~wrappers.debiasing.OnlineDebiaser` as the
:attr:`~wrappers.world_model.WorldModelWrapper.score_transform` of the world-model wrapper
below it, so *every* world-model score passes through the isotonic map before the env
turns it into a reward. It feeds the map with the anchor pairs the
:class:`~wrappers.anchor.AnchorWrapper` below reports, and feeds an
:class:`~wrappers.denoising.InverseVarianceWeighter` with each complete anchor group's
calibrated and true member scores once the map has been fitted (before that the scores
are not calibrated yet, and the weight stays exactly 1.0).

Stack order, outermost first: ``CalibrationWrapper(AnchorWrapper(WorldModelWrapper(env)))``.

Classes: :class:`CalibrationConfig`, :class:`CalibrationWrapper`,
:class:`VectorCalibrationWrapper`. Functions: :func:`stack_state_dict`,
:func:`load_stack_state_dict`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

import gymnasium as gym
import numpy as np
from gymnasium.vector import VectorEnv, VectorWrapper

from wrappers._common import VectorSteps, find_optional, find_wrapper, put_info, sub_info
from wrappers.anchor import AnchorWrapper, VectorAnchorWrapper, _AnchorBase
from wrappers.debiasing import OnlineDebiaser
from wrappers.denoising import InverseVarianceWeighter
from wrappers.world_model import VectorWorldModelWrapper, WorldModelWrapper, _WorldModelBase

__all__ = [
    "CalibrationConfig",
    "CalibrationWrapper",
    "VectorCalibrationWrapper",
    "stack_state_dict",
    "load_stack_state_dict",
]


@dataclass(frozen=True)
class CalibrationConfig:
    """Settings of the two corrections (defaults from the paper).

    Attributes:
        start_pairs: anchor pairs before the first isotonic fit (identity map until then).
        refit_every: refit the map after this many new pairs.
        max_pairs: FIFO cap on the pairs the map is fitted on.
        half_life: EMA half-life of the disagreement, in observed anchor groups.
        freeze_after: anchor-group observations before the weight's scale is frozen.
        weight_at_freeze: the anchor weight at the freeze.
        max_weight: upper clip of the anchor weight.
        debias: apply the isotonic map to world-model scores. With ``False`` the map is
            still fitted (``calibrated`` reports it) but rewards keep the raw scores.
        denoise: update the anchor weight. With ``False`` it stays exactly 1.0. The two
            switches give the ablation's four settings on the same reward stream.
    """

    start_pairs: int = 200
    refit_every: int = 64
    max_pairs: int = 5000
    half_life: float = 64.0
    freeze_after: int = 32
    weight_at_freeze: float = 2.0
    max_weight: float = 4.0
    debias: bool = True
    denoise: bool = True

    def debiaser(self) -> OnlineDebiaser:
        return OnlineDebiaser(self.start_pairs, self.refit_every, self.max_pairs)

    def weighter(self) -> InverseVarianceWeighter:
        return InverseVarianceWeighter(self.half_life, self.freeze_after, self.weight_at_freeze, self.max_weight)


#: The keys of the anchor layer's info that the calibration layer reads.
_READS = ("anchor_pairs", "group_result")


class _CalibrationCore:
    """Feeds the debiaser and the weighter from the info of one step (both forms)."""

    def __init__(self, config: CalibrationConfig) -> None:
        self.config = config
        self.debiaser = config.debiaser()
        self.weighter = config.weighter()

    def info(self) -> dict[str, Any]:
        return {
            "anchor_weight": self.weighter.weight,
            "calibrated": self.debiaser.fitted,
            "anchor_pairs_total": self.debiaser.n_seen,
        }

    def step(self, info: Mapping[str, Any]) -> dict[str, Any]:
        self.debiaser.add(info.get("anchor_pairs") or ())
        result = info.get("group_result")
        if self.config.denoise and result is not None and result["anchor"] and self.debiaser.fitted:
            self.weighter.observe(result["calibrated"], result["true"])
        return self.info()

    def state_dict(self) -> dict[str, Any]:
        return {
            "config": dataclasses.asdict(self.config),
            "debiaser": self.debiaser.state_dict(),
            "weighter": self.weighter.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.debiaser.load_state_dict(state["debiaser"])
        self.weighter.load_state_dict(state["weighter"])


_INFO_DOC = """
    Info keys added (reset and every step):

    * ``anchor_weight``: the current Inverse-Variance weight (exactly 1.0 before
      calibration); the trainer multiplies anchor groups' advantages by it.
    * ``calibrated``: True once the isotonic map has been fitted.
    * ``anchor_pairs_total``: anchor pairs received so far.

    The map itself shows in the world-model wrapper's ``calibrated_score`` (and in the reward).
"""


def _make_config(config: CalibrationConfig | None, overrides: dict[str, Any]) -> CalibrationConfig:
    unknown = set(overrides) - {f.name for f in dataclasses.fields(CalibrationConfig)}
    if unknown:
        raise TypeError(f"unknown CalibrationWrapper settings {sorted(unknown)}; see CalibrationConfig")
    return dataclasses.replace(config or CalibrationConfig(), **overrides)


class _CalibrationBase:
    _core: _CalibrationCore

    @property
    def debiaser(self) -> OnlineDebiaser:
        return self._core.debiaser

    @property
    def weighter(self) -> InverseVarianceWeighter:
        return self._core.weighter

    @property
    def anchor_weight(self) -> float:
        return self._core.weighter.weight

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state: the config, the pairs, the map, the EMA and the frozen scale."""
        return self._core.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._core.load_state_dict(state)


class CalibrationWrapper(_CalibrationBase, gym.Wrapper):
    __doc__ = (
        """Online Debiasing and Inverse-Variance Denoising for a single env.

    Args:
        env: ``AnchorWrapper(WorldModelWrapper(...))`` (other wrappers may sit between).
        config: a :class:`CalibrationConfig`; keyword overrides (``start_pairs=``,
            ``refit_every=``, ``max_pairs=``, ``half_life=``, ``freeze_after=``,
            ``weight_at_freeze=``, ``max_weight=``) replace its fields.
"""
        + _INFO_DOC
        + """
    Example (``env`` an OutcomeSeam env, ``wm`` a world model)::

        env = CalibrationWrapper(AnchorWrapper(WorldModelWrapper(env, wm)))
        state = stack_state_dict(env)          # JSON-ready; resume with load_stack_state_dict
"""
    )

    def __init__(self, env: gym.Env, config: CalibrationConfig | None = None, **overrides: Any) -> None:
        super().__init__(env)
        find_wrapper(env, AnchorWrapper, needed_by="CalibrationWrapper")
        self._core = _CalibrationCore(_make_config(config, overrides))
        if self._core.config.debias:
            find_wrapper(env, WorldModelWrapper, needed_by="CalibrationWrapper").score_transform = self._core.debiaser

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        return obs, {**info, **self._core.step(info)}  # a reset may complete a group (abandoned member)

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, {**info, **self._core.step(info)}


class VectorCalibrationWrapper(_CalibrationBase, VectorWrapper):
    __doc__ = (
        """The vector form of :class:`CalibrationWrapper` (over
    ``VectorAnchorWrapper(VectorWorldModelWrapper(...))``); the map acts on each batch of
    world-model scores.

    Args: as :class:`CalibrationWrapper`.
"""
        + _INFO_DOC
        + """
    Keys are per sub-env with ``_key`` masks; with same-step autoreset the step keys of an
    episode's last step are in ``info["final_info"]``.
"""
    )

    def __init__(self, env: VectorEnv, config: CalibrationConfig | None = None, **overrides: Any) -> None:
        super().__init__(env)
        find_wrapper(env, VectorAnchorWrapper, needed_by="VectorCalibrationWrapper")
        self._core = _CalibrationCore(_make_config(config, overrides))
        if self._core.config.debias:
            find_wrapper(env, VectorWorldModelWrapper, needed_by="VectorCalibrationWrapper").score_transform = (
                self._core.debiaser
            )
        self._steps = VectorSteps(env)

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None):
        mask = self._steps.on_reset(None if options is None else options.get("reset_mask"))
        obs, infos = self.env.reset(seed=seed, options=options)
        for i in np.flatnonzero(mask):  # a reset may complete a group (abandoned member)
            self._core.step(sub_info(infos, i, _READS))
        report = self._core.info()
        for i in np.flatnonzero(mask):
            put_info(infos, self.num_envs, i, report)
        return obs, infos

    def step(self, actions: Any):
        stepped = self._steps.stepped()
        obs, rewards, terminated, truncated, infos = self.env.step(actions)
        ended, _ = self._steps.on_step(stepped, terminated, truncated)
        # First feed every sub-env's pairs and results, then report one weight to all.
        for i in np.flatnonzero(stepped):
            self._core.step(sub_info(self._steps.step_info_target(infos, ended, i), i, _READS))
        report = self._core.info()
        for i in range(self.num_envs):
            put_info(infos, self.num_envs, i, report)
            target = self._steps.step_info_target(infos, ended, i)
            if target is not infos:
                put_info(target, self.num_envs, i, report)
        return obs, rewards, terminated, truncated, infos


_LAYERS = (("world_model", _WorldModelBase), ("anchor", _AnchorBase), ("calibration", _CalibrationBase))


def stack_state_dict(env: Any) -> dict[str, Any]:
    """The JSON-serialisable state of every wmrl wrapper in ``env``'s stack (single or vector):
    ``{"world_model": ..., "anchor": ..., "calibration": ...}`` for the layers present."""
    state = {name: layer.state_dict() for name, layer in _layers(env)}
    if not state:
        raise TypeError(f"stack_state_dict: no wmrl wrapper in {env!r}")
    return state


def load_stack_state_dict(env: Any, state: Mapping[str, Any]) -> None:
    """Restore :func:`stack_state_dict` output into an identically built stack."""
    layers = dict(_layers(env))
    if set(layers) != set(state):
        raise ValueError(f"load_stack_state_dict: saved layers {sorted(state)}, this stack has {sorted(layers)}")
    for name, layer in layers.items():
        layer.load_state_dict(state[name])


def _layers(env: Any) -> list[tuple[str, Any]]:
    """``(name, wrapper)`` for each wmrl layer present in the stack."""
    found = [(name, find_optional(env, cls)) for name, cls in _LAYERS]
    return [(name, layer) for name, layer in found if layer is not None]
