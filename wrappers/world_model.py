"""Grade actions with a world model instead of (or as well as) real execution.

The wrapped env must implement the outcome seam (:class:`wmrl_envs.seam.OutcomeSeam`):
the wrapper asks the env for the grading request of an action, grades it, and hands the
outcome to the env through ``pending_outcome`` before ``step``, so observations, rewards,
turn counting and ``info`` are the env's own code whichever source graded.

Modes (per sub-env in the vector form):

* ``"wm"``: the world model grades; real grading is skipped. The reward comes from the
  world-model outcome after :attr:`score_transform` (the calibration map, when a
  :class:`~wrappers.calibration.CalibrationWrapper` installed one).
* ``"both"``: graded for real *and* by the world model; the reward comes from the real
  outcome, the world-model outcome is reported in ``info`` (anchor groups).
* ``"env"``: real grading only (a plain env plus counters).

A world model answering ``None`` means *unknown*; it is passed to the env as such (the env
gives no score for it), never turned into 0.

Classes: :class:`WorldModelWrapper`, :class:`VectorWorldModelWrapper`, :class:`GradingCounters`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, SupportsFloat, cast

import gymnasium as gym
import numpy as np
from gymnasium.utils import RecordConstructorArgs
from gymnasium.vector import VectorEnv, VectorWrapper
from gymnasium.vector.utils import iterate

from wmrl_envs.outcome import Outcome
from wmrl_envs.seam import GRADE_FOR_REAL, GradingRequest, OutcomeSeam
from wrappers._common import VectorSteps, known_info, put_info, sub_info
from wrappers._record import record_constructor_args

if TYPE_CHECKING:  # the protocol only; any object with predict() works
    from wmrl_envs.world_models.base import WorldModel

__all__ = ["WorldModelWrapper", "VectorWorldModelWrapper", "GradingCounters", "MODES", "ScoreTransform"]

MODES = ("wm", "both", "env")

#: Maps a batch of raw world-model scores to the scores that become rewards.
ScoreTransform = Callable[[Sequence[float | None]], list[float | None]]


@dataclass
class GradingCounters:
    """Cumulative grading counters of one wrapper (JSON-ready via :meth:`to_dict`).

    Attributes:
        real_executions: gradings done for real (each one a sandbox run / simulation).
        real_seconds: wall seconds spent waiting for real grading.
        wm_calls: batched ``predict`` calls.
        wm_predictions: (context, action) pairs predicted.
        wm_unknown: predictions that came back ``None`` or with an unknown score.
        wm_seconds: wall seconds spent in ``predict``.
    """

    real_executions: int = 0
    real_seconds: float = 0.0
    wm_calls: int = 0
    wm_predictions: int = 0
    wm_unknown: int = 0
    wm_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def load(self, d: Mapping[str, Any]) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, type(getattr(self, f.name))(d[f.name]))


def _check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return mode


class _Grader:
    """World-model prediction with the score transform, counted and timed (both forms)."""

    def __init__(self, world_model: WorldModel) -> None:
        if not callable(getattr(world_model, "predict", None)):
            raise TypeError(f"world_model must have predict(contexts, actions), got {type(world_model).__name__}")
        self.world_model = world_model
        self.score_transform: ScoreTransform | None = None
        self.counters = GradingCounters()
        #: Called with ``(request, real outcome)`` for every anchor grading (mode ``"both"``, or
        #: an overlap-mode anchor's background grading as it lands): e.g. a
        #: :class:`~agents.grpo.WorldModelUpdater` collecting the policy's own labelled scripts.
        self.anchor_listeners: list[Callable[[GradingRequest, Outcome | None], object]] = []
        #: Called with ``(request, raw outcome, calibrated outcome)`` for every grading that is
        #: the world model's alone (mode ``"wm"``): e.g. a :class:`~agents.grpo.ShadowProbe`.
        self.wm_listeners: list[Callable[[GradingRequest, Outcome | None, Outcome | None], object]] = []

    def predict(self, requests: Sequence[GradingRequest]) -> tuple[list[Outcome | None], list[Outcome | None], float]:
        """``(raw, calibrated, seconds)`` for a batch of requests: one ``predict`` call."""
        if not requests:
            return [], [], 0.0
        raw, seconds = self.predict_raw(requests)
        self.count_predictions(raw, seconds)
        return raw, self.calibrate(raw), seconds

    def predict_raw(self, requests: Sequence[GradingRequest]) -> tuple[list[Outcome | None], float]:
        """``(raw outcomes, seconds)`` of one ``predict`` call, checked; nothing counted."""
        t0 = time.perf_counter()
        raw = list(self.world_model.predict([r.context for r in requests], [r.action for r in requests]))
        seconds = time.perf_counter() - t0
        if len(raw) != len(requests):
            raise ValueError(f"world model returned {len(raw)} outcomes for {len(requests)} requests")
        for o in raw:
            if o is not None and not isinstance(o, Outcome):
                raise TypeError(f"world model must return Outcome or None, got {type(o).__name__}")
        return raw, seconds

    def count_predictions(self, raw: Sequence[Outcome | None], seconds: float) -> None:
        """Count one ``predict`` call's outcomes and seconds."""
        c = self.counters
        c.wm_calls += 1
        c.wm_predictions += len(raw)
        c.wm_unknown += sum(o is None or o.score is None for o in raw)
        c.wm_seconds += seconds

    def calibrate(self, raw: Sequence[Outcome | None]) -> list[Outcome | None]:
        if self.score_transform is None:
            return list(raw)
        mapped = self.score_transform([None if o is None else o.score for o in raw])
        return [None if o is None else o.with_score(s) for o, s in zip(raw, mapped)]

    def count_real(self, n: int, seconds: float) -> None:
        self.counters.real_executions += n
        self.counters.real_seconds += seconds

    def wm_graded(self, request: GradingRequest, raw: Outcome | None, calibrated: Outcome | None) -> None:
        """Tell the world-model listeners about one grading by the world model alone."""
        for listener in self.wm_listeners:
            listener(request, raw, calibrated)

    def anchor_graded(self, request: GradingRequest, outcome: Outcome | None) -> None:
        """Tell the anchor listeners about one anchor's real grading."""
        for listener in self.anchor_listeners:
            listener(request, outcome)


def _score(o: Outcome | None) -> float | None:
    return None if o is None else o.score


def _grading_info(
    mode: str | None,
    raw: Outcome | None,
    calibrated: Outcome | None,
    real: Outcome | None,
    real_seconds: float,
    wm_seconds: float,
    counters: GradingCounters,
) -> dict[str, Any]:
    """The info keys this wrapper adds; ``mode`` is ``None`` when nothing was graded."""
    return {
        "source": None if mode is None else ("wm" if mode == "wm" else "env"),
        "wm_score": _score(raw) if mode in ("wm", "both") else None,
        "calibrated_score": _score(calibrated) if mode in ("wm", "both") else None,
        "true_score": _score(real) if mode in ("both", "env") else None,
        "wm_outcome": raw if mode in ("wm", "both") else None,
        "real_seconds": real_seconds,
        "wm_seconds": wm_seconds,
        "real_executions": counters.real_executions,
        "wm_predictions": counters.wm_predictions,
    }


class _WorldModelBase:
    """Attributes and persistence shared by both forms (mixin)."""

    _grader: _Grader

    @property
    def world_model(self) -> WorldModel:
        return self._grader.world_model

    @world_model.setter
    def world_model(self, model: WorldModel) -> None:
        """Swap the world model (e.g. for one refitted on anchors; call it between steps)."""
        if not callable(getattr(model, "predict", None)):
            raise TypeError(f"world_model must have predict(contexts, actions), got {type(model).__name__}")
        self._grader.world_model = model

    @property
    def counters(self) -> GradingCounters:
        """Cumulative :class:`GradingCounters`."""
        return self._grader.counters

    @property
    def anchor_listeners(self) -> list[Callable[[GradingRequest, Outcome | None], object]]:
        """Called with ``(request, real outcome)`` for every anchor grading (see :class:`_Grader`)."""
        return self._grader.anchor_listeners

    @property
    def wm_listeners(self) -> list[Callable[[GradingRequest, Outcome | None, Outcome | None], object]]:
        """Called with ``(request, raw, calibrated)`` for every world-model-only grading."""
        return self._grader.wm_listeners

    @property
    def score_transform(self) -> ScoreTransform | None:
        """Applied to every batch of world-model scores before they become rewards
        (``None`` = identity). :class:`~wrappers.calibration.CalibrationWrapper` installs its map here."""
        return self._grader.score_transform

    @score_transform.setter
    def score_transform(self, fn: ScoreTransform | None) -> None:
        if fn is not None and not callable(fn):
            raise TypeError(f"score_transform must be callable or None, got {type(fn).__name__}")
        self._grader.score_transform = fn

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state (the counters)."""
        return {"counters": self.counters.to_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.counters.load(state["counters"])


class WorldModelWrapper(_WorldModelBase, gym.Wrapper, RecordConstructorArgs):
    """Grades a single env's actions with a world model (``mode="wm"``), with both the world
    model and real execution (``"both"``), or for real only (``"env"``).

    Args:
        env: an env whose ``unwrapped`` is an :class:`~wmrl_envs.seam.OutcomeSeam`.
        world_model: anything with ``predict(contexts, actions) -> list[Outcome | None]``.
        mode: ``"wm"``, ``"both"`` or ``"env"``; a plain attribute, switched per episode by
            :class:`~wrappers.anchor.AnchorWrapper`.

    Info keys added on every step (``None`` where they do not apply, e.g. a step with no
    grading request):

    * ``source``: ``"wm"`` if the reward came from the world model, ``"env"`` if from real
      grading, ``None`` if nothing was graded.
    * ``wm_score``: the world model's raw score (``"wm"`` / ``"both"``).
    * ``calibrated_score``: ``wm_score`` after :attr:`score_transform` (what the reward is
      built from in ``"wm"`` mode).
    * ``true_score``: the real outcome's score (``"both"`` / ``"env"``).
    * ``wm_outcome``: the raw world-model :class:`~wmrl_envs.outcome.Outcome`.
    * ``real_seconds`` / ``wm_seconds``: seconds spent grading for real / predicting in this step.
    * ``real_executions`` / ``wm_predictions``: cumulative counters (see :attr:`counters`).

    Example (``env`` any OutcomeSeam env, ``wm`` any world model)::

        env = WorldModelWrapper(env, wm, mode="wm")
        obs, info = env.reset(seed=0)
        obs, reward, terminated, truncated, info = env.step(action)
        info["source"], info["wm_score"], env.counters.real_executions   # "wm", 0.7, 0
    """

    def __init__(self, env: gym.Env, world_model: WorldModel, mode: str = "wm") -> None:
        record_constructor_args(self, world_model=world_model, mode=mode)  # by reference: see wrappers._record
        super().__init__(env)
        if not isinstance(env.unwrapped, OutcomeSeam):
            raise TypeError(f"WorldModelWrapper needs an OutcomeSeam env, got {type(env.unwrapped).__name__}")
        self._grader = _Grader(world_model)
        self._mode = _check_mode(mode)

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, mode: str) -> None:
        self._mode = _check_mode(mode)

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        request = self.env.get_wrapper_attr("grading_request")(action)
        mode = None if request is None else self._mode
        raw = calibrated = real = None
        wm_seconds = real_seconds = 0.0
        if mode in ("wm", "both"):
            (raw,), (calibrated,), wm_seconds = self._grader.predict([request])
        if mode == "wm":
            self._grader.wm_graded(request, raw, calibrated)
        if mode in ("both", "env"):
            t0 = time.perf_counter()
            real = self.env.get_wrapper_attr("grade")(request)
            real_seconds = time.perf_counter() - t0
            self._grader.count_real(1, real_seconds)
            if mode == "both":
                self._grader.anchor_graded(request, real)
        if mode is not None:
            self.env.set_wrapper_attr("pending_outcome", calibrated if mode == "wm" else real)
        obs, reward, terminated, truncated, info = self.env.step(action)
        info = {
            **info,
            **known_info(_grading_info(mode, raw, calibrated, real, real_seconds, wm_seconds, self.counters)),
        }
        return obs, reward, terminated, truncated, info


class _SeamVectorEnv(Protocol):
    """What the vector wrapper needs of the env below it: ``SyncVectorEnv`` / ``AsyncVectorEnv``'s
    ``call`` and ``set_attr`` (Gymnasium's ``VectorEnv`` base class does not declare them)."""

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]: ...

    def set_attr(self, name: str, values: Any) -> None: ...


class VectorWorldModelWrapper(_WorldModelBase, VectorWrapper, RecordConstructorArgs):
    """The vector form of :class:`WorldModelWrapper`: one batched ``predict`` call per vector
    step for all sub-envs that need a world-model grade.

    Requests come from ``set_attr("pending_action", actions)`` then
    ``call("pending_grading_request")``; outcomes go back with one
    ``set_attr("pending_outcome", [...])``. Sub-envs in ``"both"`` / ``"env"`` mode grade
    for real inside their own ``step`` (in parallel under ``AsyncVectorEnv``), so the real
    outcome is read from the env's ``info["outcome"]`` (docs/contracts.md); a step without one
    is graded as unknown.

    Args:
        env: a ``VectorEnv`` whose sub-envs are OutcomeSeam envs.
        world_model: as in :class:`WorldModelWrapper`.
        mode: the initial mode of every sub-env; :attr:`modes` holds one per sub-env.

    Info keys: as :class:`WorldModelWrapper`, per sub-env (``_key`` masks). ``wm_seconds`` is
    the batch's predict time divided over its predictions; ``real_seconds`` is the wall
    time of the vector step, on each sub-env that graded for real (they run in parallel).
    With same-step autoreset, the keys of an episode's last step are in ``info["final_info"]``.

    Autoreset: same-step (recommended, as for LLM envs) and disabled work with any seam env.
    Under next-step autoreset, a sub-env about to autoreset is asked for
    ``grading_request(None)`` after its episode ended; envs that refuse that (the
    AutoResearch env raises) need one of the other modes.
    """

    def __init__(self, env: VectorEnv, world_model: WorldModel, mode: str = "wm") -> None:
        record_constructor_args(self, world_model=world_model, mode=mode)
        super().__init__(env)
        self._grader = _Grader(world_model)
        self.modes: list[str] = [_check_mode(mode)] * self.num_envs
        self._steps = VectorSteps(env)
        # preview() of the coming step: {sub-env: (graded action, raw outcome)}, and its seconds
        self._previewed: dict[int, tuple[Any, Outcome | None]] = {}
        self._previewed_seconds = 0.0

    def set_mode(self, i: int, mode: str) -> None:
        """Set sub-env ``i``'s mode."""
        self.modes[i] = _check_mode(mode)

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None):
        self._steps.on_reset(None if options is None else options.get("reset_mask"))
        return self.env.reset(seed=seed, options=options)  # type: ignore[arg-type]  # gymnasium types seed int | None; vector envs take lists

    def _requests(self, actions: Any) -> tuple[np.ndarray, list[GradingRequest | None]]:
        """The sub-envs stepping now and their grading requests (``None``: nothing to grade)."""
        stepped = self._steps.stepped()
        # A sub-env that autoresets in this step (next-step mode) gets no action: its
        # episode is over, so it has nothing to grade.
        pending_actions = [a if stepped[i] else None for i, a in enumerate(iterate(self.action_space, actions))]
        seam_env = cast(_SeamVectorEnv, self.env)
        seam_env.set_attr("pending_action", pending_actions)
        return stepped, list(seam_env.call("pending_grading_request"))

    def preview(self, actions: Any, sub_envs: Sequence[int]) -> dict[int, tuple[Any, Outcome | None]]:
        """The raw world-model outcomes of the coming :meth:`step`'s ``actions`` on ``sub_envs``,
        before it runs: ``{i: (the action as graded, outcome)}`` for those with something to
        grade. One counted ``predict`` call; the next ``step`` reuses these predictions for the
        same actions instead of predicting them again (the anchor layer's informative
        selection reads them to choose which groups to grade for real)."""
        stepped, requests = self._requests(actions)
        idx = [i for i in sub_envs if stepped[i] and requests[i] is not None]
        if not idx:
            return {}
        raw, seconds = self._grader.predict_raw([requests[i] for i in idx])  # type: ignore[misc]  # filtered above
        self._grader.count_predictions(raw, seconds)
        self._previewed = {i: (requests[i].action, o) for i, o in zip(idx, raw)}  # type: ignore[union-attr]
        self._previewed_seconds = seconds
        return dict(self._previewed)

    def _predict(
        self, requests: Sequence[GradingRequest | None], wm_idx: list[int]
    ) -> tuple[list[Outcome | None], float]:
        """Raw outcomes for ``wm_idx`` (previewed ones reused when the action is the same) and
        the seconds spent predicting them, the preview's included."""
        previewed, self._previewed = self._previewed, {}
        seconds, self._previewed_seconds = self._previewed_seconds, 0.0
        fresh = [i for i in wm_idx if i not in previewed or previewed[i][0] != requests[i].action]  # type: ignore[union-attr]
        raw = {i: previewed[i][1] for i in wm_idx if i not in fresh}
        if fresh:
            predicted, fresh_seconds = self._grader.predict_raw([requests[i] for i in fresh])  # type: ignore[misc]
            self._grader.count_predictions(predicted, fresh_seconds)
            raw.update(zip(fresh, predicted))
            seconds += fresh_seconds
        return [raw[i] for i in wm_idx], seconds

    def step(self, actions: Any):
        n = self.num_envs
        stepped, requests = self._requests(actions)
        seam_env = cast(_SeamVectorEnv, self.env)
        modes: list[str | None] = [
            m if (stepped[i] and requests[i] is not None) else None for i, m in enumerate(self.modes)
        ]
        wm_idx = [i for i in range(n) if modes[i] in ("wm", "both")]
        raw_list, wm_seconds = self._predict(requests, wm_idx)
        cal_list = self._grader.calibrate(raw_list)
        raw: list[Outcome | None] = [None] * n
        calibrated: list[Outcome | None] = [None] * n
        for i, r, c in zip(wm_idx, raw_list, cal_list):
            raw[i], calibrated[i] = r, c
            if modes[i] == "wm":
                self._grader.wm_graded(requests[i], r, c)  # type: ignore[arg-type]  # graded: has a request
        pending = [calibrated[i] if modes[i] == "wm" else GRADE_FOR_REAL for i in range(n)]
        seam_env.set_attr("pending_outcome", pending)

        t0 = time.perf_counter()
        obs, rewards, terminated, truncated, infos = self.env.step(actions)
        elapsed = time.perf_counter() - t0
        ended, _ = self._steps.on_step(stepped, terminated, truncated)
        real_idx = [i for i in range(n) if modes[i] in ("both", "env")]
        if real_idx:
            self._grader.count_real(len(real_idx), elapsed)
        per_wm = wm_seconds / len(wm_idx) if wm_idx else 0.0
        for i in range(n):
            if not stepped[i]:
                continue  # this sub-env autoreset instead of stepping
            target = self._steps.step_info_target(infos, ended, i)
            real = None
            if modes[i] in ("both", "env"):  # no info['outcome'] = unknown (docs/contracts.md)
                real = sub_info(target, i, ("outcome",)).get("outcome")
            if modes[i] == "both":
                self._grader.anchor_graded(requests[i], real)  # type: ignore[arg-type]  # graded: has a request
            extra = _grading_info(
                modes[i],
                raw[i],
                calibrated[i],
                real,
                elapsed if modes[i] in ("both", "env") else 0.0,
                per_wm if modes[i] in ("wm", "both") else 0.0,
                self.counters,
            )
            put_info(target, n, i, extra)
        return obs, rewards, terminated, truncated, infos
