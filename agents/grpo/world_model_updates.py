"""A world model that learns from its anchors: refit it on the real outcomes of the policy's own scripts.

Every anchor member is graded for real as well as by the world model: a labelled example of
exactly the code the world model is asked about, the current policy's. A
:class:`WorldModelUpdater` (a callback of :func:`agents.grpo.train`) collects these gradings as
execution-log records (``origin="anchor"``). Every ``every`` new records it refits a *copy* of
the world model on its training data plus every anchor record so far (the model's ``update``,
e.g. :meth:`~wmrl_envs.world_models.CodeOutcomeModel.update`) in a background thread, so the fit
overlaps the next training steps, and swaps the copy in at the first step boundary after the
fit is done (never inside a step: every member of a group is graded by one model). The
thread's CPU is this process's, so a budget that counts process CPU (the speedup benchmark's)
charges the refits to the run.

A seeded share ``holdout`` of the scripts (by task and code, so a script the policy writes
again stays on its side) is never fitted on. At every swap, and on :meth:`fidelity`, the
current model and the model the run started with are scored on those held-back anchor scripts
(status accuracy, within-task Spearman, pairwise accuracy:
:func:`wmrl_envs.world_models.transfer.ranking_metrics`): fidelity on the policy's own code with
and without the updates, on the same scripts (:attr:`history`).

Example::

    updater = WorldModelUpdater(env, every=64)
    train(LLMAgent(policy, env, scaffold, config, tasks=tasks), callbacks=[updater])
    updater.history[-1]["updated"]["status_accuracy"], updater.history[-1]["initial"]["status_accuracy"]

Classes: :class:`WorldModelUpdater`.
"""

from __future__ import annotations

import copy
import hashlib
import threading
import time
from collections.abc import Mapping
from typing import Any

from wmrl_envs.outcome import Outcome
from wmrl_envs.world_models.logs import LogRecord
from wmrl_envs.world_models.transfer import predict_records, ranking_metrics
from wrappers import StackHandle

__all__ = ["WorldModelUpdater"]

#: The fidelity numbers kept per measurement (``ranking_metrics`` has more).
_KEPT = ("n_records", "n_tasks", "status_accuracy", "spearman_within_task", "pairwise_accuracy", "mae")


class WorldModelUpdater:
    """Refit the stack's world model on its anchors' real outcomes (see the module docstring).

    Args:
        env: the training stack (with anchor groups and a world model that has ``update``).
        every: new (fitted-on) anchor records between refits.
        holdout: share of the scripts held back to measure fidelity, never fitted on.
        seed: salt of the held-back split.
        background: refit in a background thread (``False``: inside the callback, blocking).
    """

    def __init__(
        self, env: Any, *, every: int = 64, holdout: float = 0.25, seed: int = 0, background: bool = True
    ) -> None:
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be an int >= 1, got {every!r}")
        if not 0.0 <= holdout < 1.0:
            raise ValueError(f"holdout must be in [0, 1), got {holdout!r}")
        self.handle = StackHandle(env)
        model = self.handle.world_model
        if not callable(getattr(model, "update", None)):
            raise TypeError(f"the stack's world model ({type(model).__name__}) has no update(records) to refit with")
        self.every, self.holdout, self.seed, self.background = every, holdout, seed, background
        self.initial = model
        self.fitted: list[LogRecord] = []  # anchor records the refits use
        self.held_back: list[LogRecord] = []
        self.in_model = 0  # fitted records the current model has seen (its update appends rows)
        self.history: list[dict[str, Any]] = []
        self.fit_seconds = 0.0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._ready: tuple[Any, int, float] | None = None  # (refitted model, records it has seen, CPU s)
        self._error: BaseException | None = None
        self._restore = False  # a resumed run: refit on every saved record at the first boundary
        self.handle.on_anchor_graded(self._on_anchor)

    # -- collecting -------------------------------------------------------------------------
    def _on_anchor(self, request: Any, outcome: Outcome | None) -> None:
        if outcome is None:  # the grader failed: unknown, not a label
            return
        context = dict(request.context)
        record = LogRecord(str(context.get("task_id", "")), str(request.action), context, outcome, origin="anchor")
        with self._lock:
            if self._is_held_back(record):
                self.held_back.append(record)
            else:
                self.fitted.append(record)

    def _is_held_back(self, record: LogRecord) -> bool:
        digest = hashlib.sha256(f"{self.seed}\0{record.task_id}\0{record.code}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < self.holdout

    # -- refitting ---------------------------------------------------------------------------
    @property
    def pending(self) -> int:
        """Fitted-on anchor records the current model has not seen yet."""
        return len(self.fitted) - self.in_model

    def __call__(self, step: int, metrics: Mapping[str, Any]) -> bool:
        """Step boundary: swap in a finished refit, start the next one when due. Never stops training."""
        if self._error is not None:
            raise RuntimeError("the background world-model refit failed") from self._error
        if self._ready is not None:
            self._swap(step)
        due = self.pending >= self.every or (self._restore and self.pending > 0)
        if due and self._thread is None:
            self._restore = False
            with self._lock:
                new, total = self.fitted[self.in_model :], len(self.fitted)
            current = self.handle.world_model
            if self.background:
                self._thread = threading.Thread(target=self._refit, args=(current, new, total), daemon=True)
                self._thread.start()
            else:
                self._refit(current, new, total)
                self._swap(step)
        return False

    def _refit(self, current: Any, new: list[LogRecord], total: int) -> None:
        try:
            t0 = time.thread_time()
            fresh = copy.deepcopy(current)  # the stack keeps grading with the current model until the swap
            fresh.update(new)  # its stored training data plus the records it has not seen
            self._ready = (fresh, total, time.thread_time() - t0)
        except BaseException as e:  # surfaced at the next step boundary, not lost in the thread
            self._error = e

    def _swap(self, step: int) -> None:
        assert self._ready is not None
        model, seen, seconds = self._ready
        self._ready, self._thread = None, None
        self.handle.world_model = model
        self.in_model = seen
        self.fit_seconds += seconds
        self.history.append({"step": step, "anchor_records": seen, "fit_cpu_s": seconds, **self.fidelity()})

    def wait(self) -> None:
        """Block until a refit in flight is done (it is swapped in at the next step boundary)."""
        if self._thread is not None:
            self._thread.join()

    # -- measuring ---------------------------------------------------------------------------
    def fidelity(self) -> dict[str, Any]:
        """``{"held_back": n, "initial": {...}, "updated": {...}}``: the model the run started
        with and the current one on the held-back anchor scripts (empty dicts without any)."""
        with self._lock:
            records = [r for r in self.held_back if r.known]
        out: dict[str, Any] = {"held_back": len(records), "initial": {}, "updated": {}}
        if records:
            for name, model in (("initial", self.initial), ("updated", self.handle.world_model)):
                metrics = ranking_metrics(predict_records(model, records), records)
                out[name] = {k: metrics.get(k) for k in _KEPT}
        return out

    # -- persistence -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """JSON-ready: the anchor records (both sides), the history, the refits' CPU. The
        refitted model is not saved: a resumed run refits the restored world model on every
        saved record at its first step boundary (the same records, the same fit)."""
        with self._lock:
            return {
                "fitted": [r.to_dict() for r in self.fitted],
                "held_back": [r.to_dict() for r in self.held_back],
                "history": list(self.history),
                "fit_seconds": self.fit_seconds,
            }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output onto a stack whose world model is the run's initial one."""
        with self._lock:
            self.fitted = [LogRecord.from_dict(d) for d in state["fitted"]]
            self.held_back = [LogRecord.from_dict(d) for d in state["held_back"]]
            self.history = list(state["history"])
            self.fit_seconds = float(state["fit_seconds"])
            self.in_model = 0
            self._restore = bool(self.history)  # the saved run had swapped in a refit
