"""Calibration of world-model rewards from anchor groups: Online Debiasing and
Inverse-Variance Denoising (the paper's two corrections).

The corrections live in :class:`Calibrator`, a plain, serialisable object that both wrapper
forms use and that experiments can drive directly (``benchmarks/ablation.py`` does). The
wrapper installs the calibrator's :class:`~wrappers.parts.debiasing.OnlineDebiaser` as the
:attr:`~wrappers.world_model.WorldModelWrapper.score_transform` of the world-model wrapper
below it, so *every* world-model score passes through the isotonic map before the env
turns it into a reward. It feeds the map with the anchor pairs the
:class:`~wrappers.anchor.AnchorWrapper` below reports, and feeds an
:class:`~wrappers.parts.denoising.InverseVarianceWeighter` with each complete anchor group's
calibrated and true member scores once the map has been fitted (before that the scores
are not calibrated yet, and the weight stays exactly 1.0; ``weighter_start="first-anchor"``
observes from the first anchor group instead, as the reference implementation does).

**Step boundaries.** Anchor pairs are stored as they arrive, but the map is refitted only at
a step boundary, so the members of one GRPO group are always calibrated by the same map
(a refit between two members' gradings would give them different maps, and the group's
advantages would mix them). A boundary is:

* every ``begin_step`` call on the anchor layer (the GRPO trainer announces each step's
  groups there, after the previous step's groups have all finished); once a loop has
  called it, only these calls are boundaries, so single-env and vector stacks driven by
  the same trainer refit at exactly the same moments;
* in a loop that never calls ``begin_step`` (a plain SB3 / Gymnasium loop), any moment at
  which no open group has a member graded by the world model yet, e.g. after every
  episode of a single-env loop with automatic groups. A vector loop whose multi-turn
  episodes always overlap never reaches such a moment; it should call ``begin_step``.

A refit due at a boundary applies the pairs gathered up to it; :meth:`Calibrator.state_dict`
holds the pairs, the map, the weighter and whether the loop announces steps, so a resumed
run refits at the same boundaries.

Stack order, outermost first: ``CalibrationWrapper(AnchorWrapper(WorldModelWrapper(env)))``.

Classes: :class:`CalibrationConfig`, :class:`Calibrator`, :class:`CalibrationWrapper`,
:class:`VectorCalibrationWrapper`. Functions: :func:`stack_state_dict`,
:func:`load_stack_state_dict`. Constant: :data:`WEIGHTER_STARTS`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.utils import RecordConstructorArgs
from gymnasium.vector import VectorEnv, VectorWrapper

from wrappers._common import VectorSteps, find_layer, known_info, put_info, require_layer, sub_info
from wrappers._record import record_constructor_args
from wrappers.anchor import AnchorWrapper, VectorAnchorWrapper, _AnchorBase, _AnchorCore
from wrappers.parts.debiasing import START_RULES, OnlineDebiaser
from wrappers.parts.denoising import InverseVarianceWeighter
from wrappers.world_model import VectorWorldModelWrapper, WorldModelWrapper, _WorldModelBase

__all__ = [
    "CalibrationConfig",
    "Calibrator",
    "WEIGHTER_STARTS",
    "CalibrationWrapper",
    "VectorCalibrationWrapper",
    "stack_state_dict",
    "load_stack_state_dict",
]


#: When the Inverse-Variance weighter starts observing (see :class:`CalibrationConfig`).
WEIGHTER_STARTS = ("after-fit", "first-anchor")


@dataclass(frozen=True)
class CalibrationConfig:
    """Settings of the two corrections (defaults from the paper).

    Attributes:
        start_pairs: anchor pairs before the first isotonic fit (identity map until then);
            with ``start_rule="cv"``, the fewest pairs at which the data may start it.
        start_rule: ``"count"`` (default, the paper's: the first fit at ``start_pairs``) or
            ``"cv"`` (the first fit once the map's cross-validated error on the pairs so far
            beats the identity's by more than a standard error; see
            :mod:`wrappers.parts.debiasing`): calibration then engages at the budget where
            the data supports it, e.g. ``CalibrationConfig(start_pairs=16, start_rule="cv")``.
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
        weighter_start: when the weighter starts observing anchor groups (one of
            :data:`WEIGHTER_STARTS`). ``"after-fit"`` (default): once the map has been
            fitted, so the EMA and the frozen scale measure the *calibrated* world model's
            residual, which is the quantity the paper's rule rho = 1 + eta^2 / eta^2_cal is
            about, and the weight is exactly 1.0 until calibration. ``"first-anchor"``: from
            the first anchor group, as the paper's reference implementation does; the
            pre-fit groups then measure the raw world model's disagreement (bias
            included), so with the paper's constants (32 groups to freeze, 200 pairs to
            fit) the scale freezes on raw disagreement and the weight falls below 2 as the
            map removes the bias.
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
    weighter_start: str = "after-fit"
    start_rule: str = "count"

    def __post_init__(self) -> None:
        if self.weighter_start not in WEIGHTER_STARTS:
            raise ValueError(f"weighter_start must be one of {WEIGHTER_STARTS}, got {self.weighter_start!r}")
        if self.start_rule not in START_RULES:
            raise ValueError(f"start_rule must be one of {START_RULES}, got {self.start_rule!r}")

    def debiaser(self) -> OnlineDebiaser:
        return OnlineDebiaser(self.start_pairs, self.refit_every, self.max_pairs, self.start_rule)

    def weighter(self) -> InverseVarianceWeighter:
        return InverseVarianceWeighter(self.half_life, self.freeze_after, self.weight_at_freeze, self.max_weight)


#: The keys of the anchor layer's info that the calibration layer reads.
_READS = ("anchor_pairs", "group_result")


class Calibrator:
    """Online Debiasing and Inverse-Variance Denoising on a stream of anchor groups: the core
    both wrapper forms use, usable without any env (experiments, other RL loops).

    Per training step: call :meth:`begin_step` (the boundary at which a due refit happens),
    calibrate the step's world-model scores with :meth:`transform`, reward anchor groups with
    their true scores and multiply their advantages by :attr:`anchor_weight`; when an anchor
    group is complete, feed its pairs and its members' calibrated and true scores with
    :meth:`observe_group` (or the anchor layer's info with :meth:`step`).

    Args:
        config: a :class:`CalibrationConfig` (default: the paper's constants).

    >>> cal = Calibrator(CalibrationConfig(start_pairs=4, freeze_after=1))
    >>> cal.transform([0.3, None]), cal.anchor_weight
    ([0.3, None], 1.0)
    >>> _ = cal.observe_group([0.6, 0.7, 0.8, 0.9], [0.0, 0.2, 0.5, 1.0])  # the map is due ...
    >>> cal.debiaser.fitted
    False
    >>> cal.begin_step()  # ... and fitted at the next step boundary
    True
    >>> cal.transform([0.6, 0.9])
    [0.0, 1.0]
    """

    def __init__(self, config: CalibrationConfig | None = None) -> None:
        self.config = config or CalibrationConfig()
        self.debiaser = self.config.debiaser()
        self.weighter = self.config.weighter()
        self.steps_announced = False  # True once begin_step was called: only its calls are boundaries

    @property
    def score_transform(self) -> OnlineDebiaser | None:
        """What the world-model layer applies to its scores: the map when ``debias``, else ``None``."""
        return self.debiaser if self.config.debias else None

    def transform(self, scores: Sequence[float | None]) -> list[float | None]:
        """World-model scores as they become rewards: mapped when ``debias``, else unchanged."""
        return (
            self.debiaser.transform(scores) if self.config.debias else [None if s is None else float(s) for s in scores]
        )

    @property
    def anchor_weight(self) -> float:
        """The anchor groups' advantage multiplier (exactly 1.0 with ``denoise=False``)."""
        return self.weighter.weight

    def begin_step(self) -> bool:
        """A training step begins: refit the map if due. Returns True if it refitted."""
        self.steps_announced = True
        return self.debiaser.refit_if_due()

    def idle_boundary(self) -> bool:
        """A boundary of a loop that does not announce steps (no open group is graded);
        ignored once :meth:`begin_step` has been called. Returns True if it refitted."""
        return False if self.steps_announced else self.debiaser.refit_if_due()

    def add_pairs(self, pairs: Iterable[Sequence[float | None]]) -> None:
        """Store anchor ``(raw wm_score, true_score)`` pairs (the map refits at a boundary)."""
        self.debiaser.add(pairs, refit=False)

    def observe_result(self, calibrated: Sequence[float | None], true: Sequence[float | None]) -> bool:
        """A complete anchor group's members: their calibrated world-model and true scores.
        Returns True if the weighter used it (``denoise`` on, started, not degenerate)."""
        started = self.debiaser.fitted or self.config.weighter_start == "first-anchor"
        return bool(self.config.denoise and started and self.weighter.observe(calibrated, true))

    def observe_group(self, wm: Sequence[float | None], true: Sequence[float | None]) -> bool:
        """A complete anchor group graded by both sources: store its pairs and observe its
        calibrated-vs-true disagreement, the group calibrated as :meth:`transform` does now.
        Returns what :meth:`observe_result` returns."""
        if len(wm) != len(true):
            raise ValueError(f"wm ({len(wm)}) and true ({len(true)}) scores differ in length")
        calibrated = self.transform(wm)
        self.add_pairs(zip(wm, true))
        return self.observe_result(calibrated, true)

    def info(self) -> dict[str, Any]:
        """The info keys the wrappers report (see their docstrings)."""
        return {
            "anchor_weight": self.weighter.weight,
            "anchor_weight_se": self.weighter.weight_se,
            "calibrated": self.debiaser.fitted,
            "anchor_pairs_total": self.debiaser.n_seen,
            "calibration_cv": self.debiaser.last_cv,  # the cv start rule's last look (None: none yet)
        }

    def step(self, info: Mapping[str, Any]) -> dict[str, Any]:
        """Feed the anchor layer's info of one step (``anchor_pairs``, ``group_result``);
        returns :meth:`info`."""
        self.add_pairs(info.get("anchor_pairs") or ())
        result = info.get("group_result")
        if result is not None and result["anchor"]:
            self.observe_result(result["calibrated"], result["true"])
        return self.info()

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state: the config, the pairs and map, the weighter, the boundary mode."""
        return {
            "config": dataclasses.asdict(self.config),
            "debiaser": self.debiaser.state_dict(),
            "weighter": self.weighter.state_dict(),
            "steps_announced": self.steps_announced,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output (the debiaser's and weighter's configs must match)."""
        self.debiaser.load_state_dict(state["debiaser"])
        self.weighter.load_state_dict(state["weighter"])
        self.steps_announced = bool(state.get("steps_announced", False))


def _attach(calibrator: Calibrator, anchor: _AnchorBase, world_model: _WorldModelBase) -> _AnchorCore:
    """Install the map below and listen to the anchor layer's ``begin_step``; returns its core."""
    if calibrator.score_transform is not None:
        world_model.score_transform = calibrator.score_transform
    core = anchor._core
    core.step_listeners.append(calibrator.begin_step)
    core.landing_listeners.append(calibrator.step)  # overlap mode: pairs and results as they land
    return core


_INFO_DOC = """
    Info keys added (reset and every step):

    * ``anchor_weight``: the current Inverse-Variance weight (exactly 1.0 before
      calibration); the trainer multiplies anchor groups' advantages by it.
    * ``anchor_weight_se``: its standard error (``InverseVarianceWeighter.weight_se``); left
      out before the weight's scale is frozen.
    * ``calibrated``: True once the isotonic map has been fitted.
    * ``anchor_pairs_total``: anchor pairs received so far.
    * ``calibration_cv``: with ``start_rule="cv"``, its last cross-validation
      (:func:`~wrappers.parts.debiasing.cross_validated_gain`; once the map is fitted, the
      one that started it); left out until there is one.

    The map itself shows in the world-model wrapper's ``calibrated_score`` (and in the reward).
"""


def _make_config(config: CalibrationConfig | None, overrides: dict[str, Any]) -> CalibrationConfig:
    unknown = set(overrides) - {f.name for f in dataclasses.fields(CalibrationConfig)}
    if unknown:
        raise TypeError(f"unknown CalibrationWrapper settings {sorted(unknown)}; see CalibrationConfig")
    return dataclasses.replace(config or CalibrationConfig(), **overrides)


class _CalibrationBase:
    _core: Calibrator
    _anchor: _AnchorCore

    @property
    def calibrator(self) -> Calibrator:
        """The :class:`Calibrator` this wrapper drives."""
        return self._core

    @property
    def debiaser(self) -> OnlineDebiaser:
        return self._core.debiaser

    @property
    def weighter(self) -> InverseVarianceWeighter:
        return self._core.weighter

    @property
    def anchor_weight(self) -> float:
        return self._core.weighter.weight

    def _idle_boundary(self) -> None:
        if not self._anchor.graded_groups_open:
            self._core.idle_boundary()

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state: the config, the pairs, the map, the EMA and the frozen scale."""
        return self._core.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._core.load_state_dict(state)


class CalibrationWrapper(_CalibrationBase, gym.Wrapper, RecordConstructorArgs):
    __doc__ = (
        """Online Debiasing and Inverse-Variance Denoising for a single env.

    Args:
        env: ``AnchorWrapper(WorldModelWrapper(...))`` (other wrappers may sit between).
        config: a :class:`CalibrationConfig`; keyword overrides (``start_pairs=``,
            ``refit_every=``, ``max_pairs=``, ``half_life=``, ``freeze_after=``,
            ``weight_at_freeze=``, ``max_weight=``, ``debias=``, ``denoise=``,
            ``weighter_start=``) replace its fields.

    The map refits at step boundaries only (module docstring): the trainer's ``begin_step``
    on the anchor layer, or, in loops that never call it, a moment with no graded group open.
"""
        + _INFO_DOC
        + """
    Example (``env`` an OutcomeSeam env, ``wm`` a world model)::

        env = CalibrationWrapper(AnchorWrapper(WorldModelWrapper(env, wm)))
        state = stack_state_dict(env)          # JSON-ready; resume with load_stack_state_dict
"""
    )

    def __init__(self, env: gym.Env, config: CalibrationConfig | None = None, **overrides: Any) -> None:
        record_constructor_args(self, config=config, **overrides)
        super().__init__(env)
        anchor = require_layer(env, AnchorWrapper, needed_by="CalibrationWrapper")
        self._core = Calibrator(_make_config(config, overrides))
        self._anchor = _attach(
            self._core, anchor, require_layer(env, WorldModelWrapper, needed_by="CalibrationWrapper")
        )

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        self._core.step(info)  # a reset may complete a group (abandoned member)
        self._idle_boundary()
        return obs, {**info, **known_info(self._core.info())}

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._core.step(info)
        self._idle_boundary()
        return obs, reward, terminated, truncated, {**info, **known_info(self._core.info())}


class VectorCalibrationWrapper(_CalibrationBase, VectorWrapper, RecordConstructorArgs):
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
        record_constructor_args(self, config=config, **overrides)
        super().__init__(env)
        anchor = require_layer(env, VectorAnchorWrapper, needed_by="VectorCalibrationWrapper")
        self._core = Calibrator(_make_config(config, overrides))
        wm = require_layer(env, VectorWorldModelWrapper, needed_by="VectorCalibrationWrapper")
        self._anchor = _attach(self._core, anchor, wm)
        self._steps = VectorSteps(env)

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None):
        mask = self._steps.on_reset(None if options is None else options.get("reset_mask"))
        obs, infos = self.env.reset(seed=seed, options=options)  # type: ignore[arg-type]  # gymnasium types seed int | None; vector envs take lists
        for i in np.flatnonzero(mask).tolist():  # a reset may complete a group (abandoned member)
            self._core.step(sub_info(infos, i, _READS))
        self._idle_boundary()
        report = self._core.info()
        for i in np.flatnonzero(mask).tolist():
            put_info(infos, self.num_envs, i, report)
        return obs, infos

    def step(self, actions: Any):
        stepped = self._steps.stepped()
        obs, rewards, terminated, truncated, infos = self.env.step(actions)
        ended, _ = self._steps.on_step(stepped, terminated, truncated)
        # First feed every sub-env's pairs and results, then report one weight to all.
        for i in np.flatnonzero(stepped).tolist():
            self._core.step(sub_info(self._steps.step_info_target(infos, ended, i), i, _READS))
        self._idle_boundary()
        report = self._core.info()
        for i in range(self.num_envs):
            put_info(infos, self.num_envs, i, report)
            target = self._steps.step_info_target(infos, ended, i)
            if target is not infos:
                put_info(target, self.num_envs, i, report)
        return obs, rewards, terminated, truncated, infos


# The anchor layer first: with overlap, its state_dict lands the real gradings in flight,
# which moves the world-model layer's counters and the calibration layer's pairs.
_LAYERS = (("anchor", _AnchorBase), ("world_model", _WorldModelBase), ("calibration", _CalibrationBase))


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
    found = [(name, find_layer(env, cls)) for name, cls in _LAYERS]
    return [(name, layer) for name, layer in found if layer is not None]
