"""Background real grading for anchor groups (``AnchorWrapper(..., overlap=True)``).

With overlap, an anchor member's step is graded by the world model like any other, so the
step returns at once, and the same grading request is graded for real in a background
thread. The real runs of anchor groups thus overlap whatever the loop does next
(generating the other groups' replies, world-model grading). Their results *land* when
the loop calls :meth:`~wrappers.anchor.AnchorWrapper.collect` (the rollout does, before it
hands episodes to the update), and on every ``reset``/``step``/``begin_step`` of the
anchor layer:

* each landed ``(raw wm_score, true_score)`` pair goes to the calibration layer at once
  (its landing listener); a complete anchor group's ``group_result`` follows when its last
  member's runs land;
* ``begin_step`` waits for every run still in flight before the step boundary, so the map
  refitted there sees exactly the pairs the synchronous stack would have given it
  (**staleness bound: pairs and group results land no later than the next step
  boundary**; rewards land before the update when the loop calls ``collect(wait=True)``
  after its rollout, as :class:`agents.llm.rollout.Rollout` does: zero steps stale);
* ``state_dict`` waits too, so a checkpoint never loses a pair.

What changes for anchor members (documented trade-off): their later turns see the
world-model outcome's feedback, not the real one (the real outcome is not known yet), and
their reward is the *landed* one: the max over turns of the real scores of graded turns
and the env's own scores of ungraded ones (the AutoResearch reward: trajectory reward =
max over turns). Overlap needs an env whose ``grade(request)`` does not depend on the
episode's state (AutoResearch; not a simulator whose outcome *is* the rollout).

Classes: :class:`BackgroundGrader`, :class:`Landing`.

>>> from concurrent.futures import ThreadPoolExecutor
>>> bg = BackgroundGrader(lambda request: request * 2, max_workers=1)
>>> bg.submit(ticket=7, request=21, wm_score=0.5)
>>> [(landing.ticket, landing.wm_score, landing.outcome) for landing in bg.landed(wait=True)]
[(7, 0.5, 42)]
>>> bg.in_flight, bg.close()
(0, None)
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Any

__all__ = ["BackgroundGrader", "Landing"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Landing:
    """One background real grading that finished.

    Attributes:
        ticket: the anchor member it belongs to.
        wm_score: the raw world-model score of the same request (``None`` if unknown).
        outcome: the real outcome (``None``: the grader failed; unknown, never 0).
        seconds: wall seconds the real grading took.
        request: the grading request it graded.
    """

    ticket: int
    wm_score: float | None
    outcome: Any
    seconds: float
    request: Any = None


class BackgroundGrader:
    """Grades requests for real in ``max_workers`` background threads.

    Args:
        grader: ``request -> outcome`` (the env's ``grade``); thread-safe.
        max_workers: real gradings at once (each is a sandbox run: size it to the cores).
    """

    def __init__(self, grader: Callable[[Any], Any], max_workers: int = 2) -> None:
        if not callable(grader):
            raise TypeError(f"grader must be callable, got {type(grader).__name__}")
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
            raise ValueError(f"overlap_workers must be an int >= 1, got {max_workers!r}")
        self.grader = grader
        self.max_workers = max_workers
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[tuple[int, float | None, Future, Any]] = []
        self._lock = threading.Lock()

    def _timed(self, request: Any) -> tuple[Any, float]:
        t0 = time.perf_counter()
        return self.grader(request), time.perf_counter() - t0

    def submit(self, ticket: int, request: Any, wm_score: float | None) -> None:
        """Start grading ``request`` for real in the background."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.max_workers, thread_name_prefix="wmrl-anchor")
            self._pending.append((ticket, wm_score, self._pool.submit(self._timed, request), request))

    @property
    def in_flight(self) -> int:
        """Gradings submitted and not yet landed."""
        with self._lock:
            return len(self._pending)

    def landed(self, wait: bool = False) -> list[Landing]:
        """The gradings that finished (all of them with ``wait``), in submission order: a
        grading lands only once every earlier one has, so pairs and group results reach the
        calibration layer in the order the synchronous stack would have produced them."""
        with self._lock:
            pending = list(self._pending)
        if wait and pending:
            wait_futures([p[2] for p in pending])
        done = []
        for p in pending:
            if not p[2].done():
                break
            done.append(p)
        with self._lock:
            del self._pending[: len(done)]
        out = []
        for ticket, wm, future, request in done:
            try:
                outcome, seconds = future.result()
            except Exception:  # the grader's own failure: unknown, never a score
                log.exception("background real grading failed; the outcome is unknown")
                outcome, seconds = None, 0.0
            out.append(Landing(ticket, wm, outcome, seconds, request))
        return out

    def close(self) -> None:
        """Wait for gradings in flight and stop the threads."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    # picklable (an env spec / deepcopy may copy the wrapper): threads and futures are not copied
    def __getstate__(self) -> dict[str, Any]:
        return {"grader": self.grader, "max_workers": self.max_workers}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["grader"], state["max_workers"])  # type: ignore[misc]
