"""The one object a training loop uses to talk to a wrapper stack.

Agents and trainers never look layers up themselves: everything they need of the stack --
announcing a step's groups, the anchor weight after a rollout, how many real executions
happened, the anchor fraction (for a guard that raises it), whether the corrections can
engage within the run, and the stack's state for checkpoints -- goes through a
:class:`StackHandle`. Every method works on any stack (``real`` | ``wm`` | ``wmrl``, single
or vector); what a stack lacks answers neutrally (no anchors: no anchor groups; no
calibration: weight 1.0; no world-model layer: no counters). A ``wmrl/Remote-v0`` env or a
:class:`~wmrl_envs.remote.RemoteVectorEnv` (its stack runs on a ``wmrl-serve`` server) is handled
through the server: steps are announced there, the anchor weight and counters read from its
``/metrics`` (the counters are the server's, every client's gradings included); the server
checkpoints its own state.

>>> import gymnasium as gym
>>> import wmrl_envs
>>> handle = StackHandle(gym.make("wmrl/AutoResearch-v0", split="train"))
>>> handle.begin_step(["g0", "g1"]), handle.anchor_weight, handle.real_executions, handle.has_state
(frozenset(), 1.0, None, False)
>>> print(corrections_budget(start_pairs=200, pairs_seen=0, steps=3, anchors_per_step=1, group_size=4))  # doctest: +ELLIPSIS
the corrections will not engage in this run: the first isotonic fit needs 200 anchor pairs (0 so far) ...
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

from wmrl_envs.remote import RemoteEnv, RemoteVectorEnv
from wrappers._common import find_layer
from wrappers.anchor import AnchorWrapper, VectorAnchorWrapper
from wrappers.calibration import CalibrationWrapper, VectorCalibrationWrapper, load_stack_state_dict, stack_state_dict
from wrappers.parts.monitor import anchor_group_stats
from wrappers.world_model import VectorWorldModelWrapper, WorldModelWrapper

__all__ = ["StackHandle", "corrections_budget", "anchors_per_step"]


class StackHandle:
    """A handle on ``env``'s wrapper stack (see the module docstring).

    Args:
        env: a ``gymnasium.Env`` or ``VectorEnv``, wrapped by :func:`~wrappers.build_stack`
            or by hand, or bare.
    """

    def __init__(self, env: Any) -> None:
        self.env = env
        self._anchor: Any = find_layer(env, (AnchorWrapper, VectorAnchorWrapper))
        self._world_model: Any = find_layer(env, (WorldModelWrapper, VectorWorldModelWrapper))
        self._calibration: Any = find_layer(env, (CalibrationWrapper, VectorCalibrationWrapper))
        unwrapped = getattr(env, "unwrapped", None)
        self._remote: RemoteEnv | RemoteVectorEnv | None = (
            unwrapped if isinstance(unwrapped, (RemoteEnv, RemoteVectorEnv)) else None
        )

    # -- a step ---------------------------------------------------------------------------
    def begin_step(self, group_ids: Iterable[Hashable], priority: Mapping[Hashable, float] | None = None) -> frozenset:
        """Announce the step's groups; returns the anchor groups among them (none without
        anchors; none yet under informative selection, which decides at the groups' first step)."""
        if self._remote is not None:
            return self._remote.begin_step(group_ids) if self._remote.stack_kind == "wmrl" else frozenset()
        if self._anchor is None:
            return frozenset()
        return frozenset(self._anchor.begin_step(list(group_ids), priority))

    @property
    def has_anchors(self) -> bool:
        return self._anchor is not None or (self._remote is not None and self._remote.stack_kind == "wmrl")

    @property
    def overlaps_anchors(self) -> bool:
        """Whether anchor members are graded for real in the background (``collect_anchors`` lands them)."""
        return self._anchor is not None and bool(self._anchor.overlap)

    def collect_anchors(self, wait: bool = False) -> list[dict[str, Any]]:
        """Overlap mode: the records of anchor members whose real gradings landed."""
        return self._anchor.collect(wait=wait) if self.overlaps_anchors else []

    @property
    def anchor_weight(self) -> float:
        """The inverse-variance anchor weight now (1.0 without a calibration layer)."""
        if self._remote is not None:
            return float(self._remote.metrics().get("anchor_weight", 1.0))
        return float(self._calibration.anchor_weight) if self._calibration is not None else 1.0

    @property
    def anchor_fraction(self) -> float | None:
        """The anchor scheduler's target share of groups (``None`` without anchors)."""
        return None if self._anchor is None else float(self._anchor.scheduler.fraction)

    @anchor_fraction.setter
    def anchor_fraction(self, value: float) -> None:
        if self._anchor is None:
            raise TypeError("this stack has no AnchorWrapper: there is no anchor fraction to set")
        self._anchor.scheduler.fraction = float(value)

    @property
    def anchor_min_per_step(self) -> int:
        return 0 if self._anchor is None else int(self._anchor.scheduler.min_per_step)

    @staticmethod
    def monitor(group_results: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
        """The exploitation monitor over a step's ``group_result`` dicts (``gap``,
        ``rank_agreement``, ``anchor_groups``, ``unknown_true``, ``grader_failure_rate``:
        :func:`wrappers.parts.monitor.anchor_group_stats`)."""
        return anchor_group_stats(group_results)

    # -- the world model -------------------------------------------------------------------
    @property
    def world_model(self) -> Any:
        """The world-model layer's model (``None`` without one)."""
        return None if self._world_model is None else self._world_model.world_model

    @world_model.setter
    def world_model(self, model: Any) -> None:
        if self._world_model is None:
            raise TypeError("this stack has no world-model layer: there is no world model to swap")
        self._world_model.world_model = model

    def on_wm_graded(self, listener: Any) -> None:
        """Call ``listener(request, raw outcome, calibrated outcome)`` for every grading of this
        stack that is the world model's alone."""
        if self._world_model is None:
            raise TypeError("this stack has no world-model layer: nothing is graded by a world model")
        self._world_model.wm_listeners.append(listener)

    def real_grader(self) -> Any:
        """The env's real grader ``request -> Outcome | None`` (a single env's ``grade``, or a
        ``SyncVectorEnv``'s first sub-env's: a request carries its task), else ``None``."""
        unwrapped = getattr(self.env, "unwrapped", None)
        sub_envs = getattr(unwrapped, "envs", None)
        if sub_envs:
            return getattr(sub_envs[0].unwrapped, "grade", None)
        return getattr(unwrapped, "grade", None)

    def on_anchor_graded(self, listener: Any) -> None:
        """Call ``listener(request, real outcome)`` for every anchor grading of this stack."""
        if self._world_model is None or self._anchor is None:
            raise TypeError("this stack has no anchor groups: nothing is graded for real beside the world model")
        self._world_model.anchor_listeners.append(listener)

    # -- what grading cost ---------------------------------------------------------------
    @property
    def real_executions(self) -> int | None:
        """Real gradings so far, counted by the world-model layer (``None`` without one: the
        bare env grades every request for real, which the caller counts)."""
        if self._remote is not None:
            counters = self._remote.metrics().get("counters")
            return None if counters is None else int(counters["real_executions"])
        return None if self._world_model is None else int(self._world_model.counters.real_executions)

    def counters(self) -> dict[str, Any] | None:
        """The world-model layer's cumulative counters (``real_executions``, ``real_seconds``,
        ``wm_predictions``, ``wm_seconds``), or ``None`` without one (a remote env: the server's)."""
        if self._remote is not None:
            counters = self._remote.metrics().get("counters")
            return None if counters is None else dict(counters)
        return None if self._world_model is None else self._world_model.counters.to_dict()

    # -- the corrections -----------------------------------------------------------------
    def corrections_idle(self, steps: int, groups_per_step: int, group_size: int) -> str | None:
        """A warning text when ``steps`` more steps cannot collect the anchor pairs of the
        first isotonic fit (see :func:`corrections_budget`), else ``None``."""
        if self._remote is not None:
            return self._remote_corrections_idle(steps, groups_per_step, group_size)
        if self._calibration is None or self._anchor is None or steps <= 0:
            return None
        cal = self._calibration.calibrator
        if cal.debiaser.fitted or not (cal.config.debias or cal.config.denoise):
            return None
        return corrections_budget(
            start_pairs=cal.config.start_pairs,
            pairs_seen=cal.debiaser.n_seen,
            steps=steps,
            anchors_per_step=anchors_per_step(self.anchor_fraction or 0.0, self.anchor_min_per_step, groups_per_step),
            group_size=group_size,
        )

    def _remote_corrections_idle(self, steps: int, groups_per_step: int, group_size: int) -> str | None:
        """:meth:`corrections_idle` from the server's ``/metrics`` (its calibrator, all clients' pairs)."""
        assert self._remote is not None
        metrics = self._remote.metrics()
        fit = metrics.get("map")
        if steps <= 0 or not isinstance(fit, dict) or fit.get("fitted") or not fit.get("corrections", True):
            return None
        per_step = anchors_per_step(
            float(metrics.get("anchor_fraction") or 0.0), int(metrics.get("anchor_min_per_step") or 0), groups_per_step
        )
        return corrections_budget(
            start_pairs=int(fit["start_pairs"]),
            pairs_seen=int(metrics.get("anchor_pairs_total") or 0),
            steps=steps,
            anchors_per_step=per_step,
            group_size=group_size,
        )

    # -- checkpoints -----------------------------------------------------------------------
    @property
    def has_state(self) -> bool:
        """Whether the stack has state to checkpoint (any wmrl layer)."""
        return self._world_model is not None or self._anchor is not None or self._calibration is not None

    def state_dict(self) -> dict[str, Any] | None:
        """The stack's JSON-ready state (anchor pairs, calibration map, weight), or ``None``."""
        return stack_state_dict(self.env) if self.has_state else None

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        load_stack_state_dict(self.env, state)


def anchors_per_step(fraction: float, min_per_step: int, groups_per_step: int) -> float:
    """Anchor groups an :class:`~wrappers.AnchorScheduler` picks per step, on average."""
    if fraction <= 0:
        return 0.0
    return float(min(groups_per_step, max(min_per_step, fraction * groups_per_step)))


def corrections_budget(
    *, start_pairs: int, pairs_seen: int, steps: int, anchors_per_step: float, group_size: int
) -> str | None:
    """The warning text when ``steps`` more steps cannot bring the anchor pairs to
    ``start_pairs`` (one pair per graded member of an anchor group), else ``None``."""
    need = start_pairs - pairs_seen
    if need <= 0:
        return None
    expected = steps * anchors_per_step * group_size
    if expected >= need:
        return None
    steps_needed = math.ceil(need / (anchors_per_step * group_size)) if anchors_per_step > 0 else None
    longer = f"about {steps_needed} steps at this anchor rate" if steps_needed else "anchors (anchor fraction > 0)"
    return (
        f"the corrections will not engage in this run: the first isotonic fit needs {start_pairs} anchor pairs "
        f"({pairs_seen} so far) and {steps} steps x {anchors_per_step:g} anchor groups x {group_size} members give "
        f"at most {expected:g}; until then the map is the identity and the anchor weight 1.0, so the run trains on "
        f"raw world-model scores. Train for {longer}, raise the anchor fraction, or lower the calibration start_pairs"
    )
