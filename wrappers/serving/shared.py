"""One anchor / calibration state shared by many single-env stacks (one per server session).

A GRPO group's members may run in different sessions (different clients, processes or
machines), so the server must keep *one* anchor scheduler, one book of open groups, one
world-model grader (its counters and the isotonic map it applies) and one
:class:`~wrappers.Calibrator` for all of them. :class:`SharedStack` builds each session's stack
with :func:`~wrappers.build_stack` (so the layers are the ordinary ones) and then points the
layers' state at the shared objects: every session's ``AnchorWrapper`` works on one slot of a
shared anchor core, every ``CalibrationWrapper`` feeds the shared calibrator, every
``WorldModelWrapper`` grades with the shared grader. The result is exactly the
``CalibrationWrapper(AnchorWrapper(WorldModelWrapper(env)))`` semantics of a vector stack whose
sub-envs come and go.

Thread safety: sessions step concurrently (one thread each); the shared state is guarded by
one re-entrant lock, held only around bookkeeping, never around a real execution or a
world-model prediction, so real runs of different sessions overlap.

Batched predictions: one world-model prediction runs at a time, and the requests of sessions
that step while it runs wait for it, then are predicted together in *one* ``predict`` call (the
world model is batched: 64 requests cost about what a few do one by one). Each session has
one request in flight (its steps are sequential), so its order is kept; each request gets its
own outcome, and its calibrated score is the shared map's at the batch's end, as it would be
under the lock one at a time. A batch the world model refuses is predicted again request by
request, so only the request at fault fails. Anchor members are batched the same way and still
graded for real afterwards.

Classes: :class:`SharedStack`.

>>> import gymnasium as gym
>>> import wmrl_envs
>>> from wmrl_envs.world_models import CodeOutcomeModel
>>> shared = SharedStack("wmrl", CodeOutcomeModel.load_default(), anchor_fraction=0.5)
>>> a = shared.attach(gym.make("wmrl/AutoResearch-v0", max_turns=1).unwrapped)
>>> b = shared.attach(gym.make("wmrl/AutoResearch-v0", max_turns=1).unwrapped)
>>> _, ia = a.reset(options={"group_id": "g", "group_size": 2})
>>> _, ib = b.reset(options={"group_id": "g", "group_size": 2})
>>> ia["anchor"] == ib["anchor"], ia["task_id"] == ib["task_id"]  # one group across two sessions
(True, True)
>>> shared.detach(a); shared.detach(b)
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

from wrappers.anchor import AnchorWrapper, _AnchorCore
from wrappers.calibration import CalibrationConfig, CalibrationWrapper, Calibrator
from wrappers.parts.monitor import anchor_group_stats
from wrappers.parts.scheduling import AnchorScheduler
from wrappers.stack import STACKS, build_stack
from wrappers.world_model import WorldModelWrapper, _Grader

__all__ = ["SharedStack"]

#: Completed anchor-group results kept for the exploitation monitor of ``/metrics``.
_RESULTS_KEPT = 256


class _Ticket:
    """One caller's requests waiting for a batched prediction, and what it got."""

    def __init__(self, requests: list[Any]) -> None:
        self.requests = requests
        self.result: tuple[list[Any], list[Any], float] | None = None
        self.error: BaseException | None = None
        self.done = False


class _LockedGrader(_Grader):
    """The shared world-model grader: predictions batched across sessions (``batch``; else one
    at a time), the counters and the map under the shared lock (see the module docstring)."""

    def __init__(self, world_model: Any, lock: threading.RLock, batch: bool = True) -> None:
        super().__init__(world_model)
        self._lock = lock
        self.batch = batch
        self.largest_batch = 0  # requests in the largest predict call so far (/metrics)
        # Its own lock: callers wait for a batch without holding the shared one, so other
        # sessions' bookkeeping goes on during a prediction.
        self._cv = threading.Condition()
        self._queue: list[_Ticket] = []
        self._running = False
        # The world model is called by one thread at a time (the batch's leader, or a caller
        # inside the shared lock); held only around the call, never while taking the shared lock.
        self._model_lock = threading.Lock()

    def predict(self, requests: Any) -> Any:
        if not requests:
            return [], [], 0.0
        owned = getattr(self._lock, "_is_owned", None)
        if not self.batch or (owned is not None and owned()):
            # one at a time; also for a caller inside the shared lock, which a batch's
            # leader needs (waiting for it there would deadlock)
            with self._lock, self._model_lock:
                self.largest_batch = max(self.largest_batch, len(requests))
                return super().predict(requests)
        ticket = _Ticket(list(requests))
        with self._cv:
            self._queue.append(ticket)
            while self._running and not ticket.done:
                self._cv.wait()
            if not ticket.done:  # no prediction running: this caller predicts all that waits
                self._running = True
                batch, self._queue = self._queue, []
        if not ticket.done:
            try:
                self._predict_batch(batch)
            except BaseException as err:  # e.g. an interrupt: no caller of the batch waits forever
                for t in batch:
                    if not t.done:
                        t.error, t.done = err, True
            finally:
                with self._cv:
                    self._running = False
                    self._cv.notify_all()
        if ticket.error is not None:
            raise ticket.error
        assert ticket.result is not None
        return ticket.result

    def _predict_batch(self, batch: list[_Ticket]) -> None:
        """One ``predict`` call for every ticket of ``batch`` (request by request if it fails)."""
        flat = [r for t in batch for r in t.requests]
        try:
            with self._model_lock:
                raw, seconds = self.predict_raw(flat)
        except Exception as err:
            if len(batch) == 1:
                batch[0].error, batch[0].done = err, True
                return
            for t in batch:  # only the request at fault fails, as one at a time
                self._predict_batch([t])
            return
        with self._lock:
            self.count_predictions(raw, seconds)
            calibrated = self.calibrate(raw)
            self.largest_batch = max(self.largest_batch, len(flat))
        start = 0
        for t in batch:
            n = len(t.requests)
            # each request's share of the call's seconds: the infos' wm_seconds sum to the counter
            t.result = (raw[start : start + n], calibrated[start : start + n], seconds * n / len(flat))
            t.done = True
            start += n

    def count_real(self, n: int, seconds: float) -> None:
        with self._lock:
            super().count_real(n, seconds)


class _SlotCore:
    """One session's view of the shared anchor core: the single-env ``AnchorWrapper`` always
    speaks of slot 0; this view maps it to the session's own slot, under the lock."""

    def __init__(self, core: _AnchorCore, slot: int, lock: threading.RLock) -> None:
        self._core = core
        self.slot = slot
        self._lock = lock

    def start(self, _slot: int, group_id: Hashable | None, size: int | None) -> dict[str, Any]:
        with self._lock:
            return self._core.start(self.slot, group_id, size)

    def step(self, _slot: int, info: Mapping[str, Any], ended: bool, deferred: bool = False) -> dict[str, Any]:
        with self._lock:
            return self._core.step(self.slot, info, ended, deferred)

    def overlap_ticket(self, _slot: int) -> int | None:
        return None  # the shared stack grades anchors inside step (no overlap)

    def __getattr__(self, name: str) -> Any:  # scheduler, graded_groups_open, state_dict, ...
        return getattr(self._core, name)


class _LockedCalibrator:
    """The shared calibrator as each session's ``CalibrationWrapper`` sees it (under the lock);
    ``on_step`` sees every info it is fed (the server checkpoints when pairs arrive)."""

    def __init__(self, calibrator: Calibrator, lock: threading.RLock, on_step: Callable[[Mapping], None]) -> None:
        self._calibrator = calibrator
        self._lock = lock
        self._on_step = on_step

    def step(self, info: Mapping[str, Any]) -> dict[str, Any]:
        with self._lock:
            out = self._calibrator.step(info)
            self._on_step(info)
            return out

    def idle_boundary(self) -> bool:
        with self._lock:
            return self._calibrator.idle_boundary()

    def info(self) -> dict[str, Any]:
        with self._lock:
            return self._calibrator.info()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._calibrator, name)


class SharedStack:
    """Builds per-session stacks of kind ``kind`` that share one anchor / calibration state.

    Args:
        kind: ``"real"``, ``"wm"`` or ``"wmrl"`` (:data:`~wrappers.STACKS`).
        world_model: the world model (required for ``wm`` / ``wmrl``; optional for ``real``,
            where it only makes real executions counted).
        anchor_fraction / anchor_min_per_step / seed: the anchor scheduler's settings
            (``wmrl``), as in :func:`~wrappers.build_stack`.
        calibration: the calibrator's :class:`~wrappers.CalibrationConfig` (default: the paper's).
        on_pairs: called (under the lock) with no argument after an info carrying anchor pairs
            or a group result reached the calibrator -- the server's checkpoint hook.
        batch_predictions: predict concurrent sessions' requests together, in one ``predict``
            call (see the module docstring); ``False``: one request at a time.
    """

    def __init__(
        self,
        kind: str,
        world_model: Any = None,
        *,
        anchor_fraction: float = 0.10,
        anchor_min_per_step: int = 1,
        seed: int = 0,
        calibration: CalibrationConfig | None = None,
        on_pairs: Callable[[], None] | None = None,
        batch_predictions: bool = True,
    ) -> None:
        if kind not in STACKS:
            raise ValueError(f"unknown stack {kind!r}; choose from {STACKS}")
        if kind != "real" and world_model is None:
            raise ValueError(f"stack {kind!r} needs a world model")
        self.kind = kind
        self.world_model = world_model
        self.lock = threading.RLock()
        self.on_pairs = on_pairs
        self._settings: dict[str, Any] = dict(
            anchor_fraction=anchor_fraction, anchor_min_per_step=anchor_min_per_step, seed=seed
        )
        self._grader = _LockedGrader(world_model, self.lock, batch_predictions) if world_model is not None else None
        self._wm_by_slot: dict[int, WorldModelWrapper] = {}
        self._free: list[int] = []
        self._stacks: dict[int, Any] = {}  # slot -> the session's outermost wrapper
        self.results: collections.deque[dict[str, Any]] = collections.deque(maxlen=_RESULTS_KEPT)
        self.anchor_core: _AnchorCore | None = None
        self.calibrator: Calibrator | None = None
        if kind == "wmrl":
            scheduler = AnchorScheduler(anchor_fraction, anchor_min_per_step, None, seed)
            self.anchor_core = _AnchorCore(scheduler, 0, self._set_mode, 1, True)
            self.calibrator = Calibrator(calibration)
            self.anchor_core.step_listeners.append(self.calibrator.begin_step)
            if self.calibrator.score_transform is not None and self._grader is not None:
                self._grader.score_transform = self.calibrator.score_transform

    # -- sessions ---------------------------------------------------------------------------
    def _set_mode(self, slot: int, mode: str) -> None:
        self._wm_by_slot[slot].mode = mode

    def attach(self, env: Any) -> Any:
        """Wrap ``env`` (a fresh single OutcomeSeam env of this session) as this stack; the
        returned env is the session's to ``reset`` / ``step``, until :meth:`detach`."""
        stack = build_stack(env, self.kind, self.world_model, **self._settings)
        wm = stack if isinstance(stack, WorldModelWrapper) else getattr(stack, "env", None)
        while wm is not None and not isinstance(wm, WorldModelWrapper):
            wm = getattr(wm, "env", None)
        with self.lock:
            slot = self._free.pop() if self._free else len(self._stacks) + len(self._free)
            if wm is not None and self._grader is not None:
                wm._grader = self._grader
                self._wm_by_slot[slot] = wm
            if self.kind == "wmrl":
                assert self.anchor_core is not None and self.calibrator is not None
                anchor, cal = stack.env, stack
                assert isinstance(anchor, AnchorWrapper) and isinstance(cal, CalibrationWrapper)
                while len(self.anchor_core.members) <= slot:
                    self.anchor_core.members.append(None)
                view = _SlotCore(self.anchor_core, slot, self.lock)
                anchor._core = view  # type: ignore[assignment]  # the view speaks the core's API
                cal._anchor = view  # type: ignore[assignment]
                cal._core = _LockedCalibrator(self.calibrator, self.lock, self._fed)  # type: ignore[assignment]
            self._stacks[slot] = stack
            stack._wmrl_slot = slot
        return stack

    def detach(self, stack: Any) -> None:
        """End a session: an episode still running counts as a finished member with the
        scores it reached (unknown if none), as a reset abandoning it would; its group's
        result, if that completes the group, reaches the calibrator. Closes the env."""
        slot = getattr(stack, "_wmrl_slot", None)
        with self.lock:
            if slot is None or self._stacks.get(slot) is not stack:
                return
            if self.anchor_core is not None and self.anchor_core.members[slot] is not None:
                result = self.anchor_core._finish(slot)
                if result is not None:
                    self._feed({"group_result": result})
            detached: Any = self._stacks.pop(slot)
            self._wm_by_slot.pop(slot, None)
            self._free.append(slot)
        detached.close()

    @property
    def sessions(self) -> int:
        return len(self._stacks)

    def _fed(self, info: Mapping[str, Any]) -> None:
        result = info.get("group_result")
        if result is not None and result.get("anchor"):
            self.results.append(dict(result))
        if (info.get("anchor_pairs") or result is not None) and self.on_pairs is not None:
            self.on_pairs()

    def _feed(self, info: Mapping[str, Any]) -> None:
        assert self.calibrator is not None
        self.calibrator.step(info)
        self._fed(info)

    # -- a training step -------------------------------------------------------------------
    def begin_step(self, group_ids: Iterable[Hashable]) -> frozenset:
        """Announce a training step's groups (the calibration's step boundary); returns the
        anchor groups among them (none without anchors)."""
        if self.anchor_core is None:
            return frozenset()
        with self.lock:
            return frozenset(self.anchor_core.begin_step(list(group_ids)))

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """JSON-ready state: the world-model counters, the anchor core (scheduler, open groups)
        and the calibrator (pairs, map, weight)."""
        with self.lock:
            state: dict[str, Any] = {"kind": self.kind}
            if self._grader is not None:
                state["world_model"] = {"counters": self._grader.counters.to_dict()}
            if self.anchor_core is not None and self.calibrator is not None:
                state["anchor"] = self.anchor_core.state_dict()
                state["calibration"] = self.calibrator.state_dict()
                state["results"] = list(self.results)
            return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output (before any session attaches). Members that were
        running in the old process are gone: each counts as a finished member with unknown
        scores, so their groups complete (and reach the calibrator) instead of staying open."""
        if state.get("kind") != self.kind:
            raise ValueError(f"checkpoint is of a {state.get('kind')!r} stack, this server runs {self.kind!r}")
        with self.lock:
            if self._stacks:
                raise RuntimeError("load_state_dict: sessions are attached; restore before serving")
            if self._grader is not None and "world_model" in state:
                self._grader.counters.load(state["world_model"]["counters"])
            if self.anchor_core is not None and self.calibrator is not None:
                self.calibrator.load_state_dict(state["calibration"])
                self.anchor_core.load_state_dict(state["anchor"])
                self.results.extend(state.get("results", []))
                self._close_dead_members()

    def _close_dead_members(self) -> None:
        core = self.anchor_core
        assert core is not None
        for group_id, group in list(core.book._groups.items()):
            for _ in range(group["joined"] - len(group["true"])):
                result = core.book.finish(group_id, None, None)
                if result is not None:
                    result["anchor"] = bool(core.scheduler.decision(group_id))
                    core.scheduler.release(group_id)
                    core._graded.discard(group_id)
                    self._feed({"group_result": result})

    # -- what /metrics reports --------------------------------------------------------------
    def metrics(self) -> dict[str, Any]:
        """Anchor share, pairs, the map's state, the anchor weight, the exploitation monitor
        over recent anchor groups and the grading counters (unknown values are ``None``)."""
        with self.lock:
            out: dict[str, Any] = {"stack": self.kind, "sessions": self.sessions}
            if self._grader is not None:
                out["counters"] = self._grader.counters.to_dict()
                out["largest_prediction_batch"] = self._grader.largest_batch
            if self.anchor_core is not None and self.calibrator is not None:
                debiaser = self.calibrator.debiaser
                out.update(
                    anchor_share=self.anchor_core.scheduler.realized_fraction,
                    anchor_fraction=self.anchor_core.scheduler.fraction,
                    anchor_min_per_step=self.anchor_core.scheduler.min_per_step,
                    anchor_pairs_total=debiaser.n_seen,
                    anchor_pairs_kept=len(debiaser.pairs),
                    map={
                        "fitted": debiaser.fitted,
                        "fits": debiaser.n_fits,
                        "start_pairs": self.calibrator.config.start_pairs,
                        "corrections": bool(self.calibrator.config.debias or self.calibrator.config.denoise),
                        "knots": debiaser.state_dict()["map"],
                    },
                    anchor_weight=self.calibrator.anchor_weight,
                    open_groups=len(self.anchor_core.book._groups),
                    monitor=anchor_group_stats(self.results),
                )
            return out
