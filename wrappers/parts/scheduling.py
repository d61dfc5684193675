"""Which GRPO groups are anchors: graded for real as well as by the world model.

A *step* is a training step, i.e. a batch of groups. Per step the scheduler picks about
``fraction`` of the groups, at least ``min_per_step`` (when ``fraction > 0``), and never
lets more than ``max_concurrent`` anchor groups be open at once. The count per step is
rounded by error diffusion (the running deficit is carried over and rounded
stochastically), so the realized fraction tracks the target over a run instead of merely
in expectation. Everything is driven by one seeded generator: the same seed and the same
sequence of steps give the same anchors.

Trainers call :meth:`AnchorScheduler.begin_step` with the step's group ids; wrappers that
see groups one reset at a time call :meth:`AnchorScheduler.assign`, which takes decisions
made by ``begin_step`` or else plans lazily (see ``groups_per_step``).

*Informative* selection decides later: :meth:`AnchorScheduler.defer` announces a step's
groups undecided, and :meth:`AnchorScheduler.decide` picks among them once their members'
actions are known, with a priority per group or ``None`` for a group not worth grading
for real (e.g. all its members wrote the same script: a degenerate group teaches the
calibration's within-group ranking nothing). The count is the same error-diffused count as
above. By default it is never more than the eligible groups, and what a step could not place
is carried to later steps -- which tracks the target only while eligible groups keep coming:
a policy that has collapsed onto one script per group offers none, and the share falls far
below the target (0.012 against 0.1 in a 3,600 CPU-s stress run). With ``fill=True`` the
groups without a priority fill what the eligible ones cannot, so the share stays on target
and a collapsed policy is still graded for real (the exploitation monitor's gap needs
exactly those groups; one distinct script still gives a calibration pair).

Classes: :class:`AnchorScheduler`. Functions: :func:`informative_priority`.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from wrappers._common import json_key

if TYPE_CHECKING:
    from wrappers.world_model import ScoreTransform

__all__ = ["AnchorScheduler", "informative_priority", "SELECTIONS"]

#: How anchor groups are chosen: ``random`` (the paper's: decided before any member is
#: sampled), ``informative`` (after the members' first actions, among the groups with >= 2
#: distinct scripts: first those whose calibrated preview scores differ, at random within
#: each tier) or ``least-confident`` (the same tiers, the world model's least confident
#: groups first within each).
SELECTIONS = ("random", "informative", "least-confident")

_STATE_VERSION = 1


class AnchorScheduler:
    """Seeded anchor-group selection with a target fraction, a per-step floor and a concurrency cap.

    Args:
        fraction: target share of groups that are anchors, in [0, 1]. ``0`` disables
            anchors entirely (the floor too); ``1`` makes every group an anchor.
        min_per_step: floor on anchors per step when ``fraction > 0`` (capped by the
            number of groups in the step). The concurrency cap wins over the floor.
        max_concurrent: most anchor groups open at once (decided and not yet
            :meth:`release`-d); ``None`` means no cap.
        seed: seed of the generator behind every decision.
        groups_per_step: for lazy use through :meth:`assign`: plan this many group slots
            at a time as one step (floor and cap apply per plan). ``None``: decide group by
            group, by error diffusion, without the floor.

    Group ids must be JSON-serialisable scalars (``int`` / ``str``) for :meth:`state_dict`.

    >>> s = AnchorScheduler(fraction=0.25, seed=0)
    >>> len(s.begin_step(range(8)))
    2
    >>> s.realized_fraction
    0.25
    """

    def __init__(
        self,
        fraction: float = 0.10,
        min_per_step: int = 1,
        max_concurrent: int | None = None,
        seed: int = 0,
        groups_per_step: int | None = None,
    ) -> None:
        if not isinstance(fraction, (int, float)) or math.isnan(fraction) or not 0.0 <= fraction <= 1.0:
            raise ValueError(f"fraction must be a number in [0, 1], got {fraction!r}")
        if not isinstance(min_per_step, int) or min_per_step < 0:
            raise ValueError(f"min_per_step must be an int >= 0, got {min_per_step!r}")
        if max_concurrent is not None and (not isinstance(max_concurrent, int) or max_concurrent < 1):
            raise ValueError(f"max_concurrent must be None or an int >= 1, got {max_concurrent!r}")
        if groups_per_step is not None and (not isinstance(groups_per_step, int) or groups_per_step < 1):
            raise ValueError(f"groups_per_step must be None or an int >= 1, got {groups_per_step!r}")
        self.fraction = float(fraction)
        self.min_per_step = min_per_step
        self.max_concurrent = max_concurrent
        self.seed = seed
        self.groups_per_step = groups_per_step
        self._rng = np.random.Generator(np.random.PCG64(seed))
        self.n_groups = 0
        self.n_anchors = 0
        self.n_steps = 0
        self._decisions: dict[Hashable, bool] = {}
        self._deferred: set[Hashable] = set()  # announced by defer(), not decided yet
        self._open: set[Hashable] = set()
        self._plan: list[bool] = []  # lazy slots not yet given to a group

    # -- decisions -----------------------------------------------------------------

    @property
    def realized_fraction(self) -> float | None:
        """Anchors / groups decided so far (``None`` before any group)."""
        return self.n_anchors / self.n_groups if self.n_groups else None

    @property
    def open_anchors(self) -> int:
        """Anchor groups decided and not yet released."""
        return len(self._open)

    def begin_step(self, group_ids: Iterable[Hashable], priority: Mapping[Hashable, float] | None = None) -> frozenset:
        """Decide a training step's groups at once; returns the anchor group ids.

        An id decided earlier is re-decided (a reused id is a new group); if it was an
        open anchor it is released first. Any lazy plan in progress is dropped.

        ``priority`` (optional, off by default): a score per group id, higher = more worth
        grading for real, e.g. ``1 - `` the world model's mean confidence over the group's
        members (``Outcome.metrics["confidence"]``). The *number* of anchors is decided
        exactly as without it (same generator draws); which groups are anchors then follows
        the priority (ties and missing ids in the seeded random order) instead of chance.

        >>> s = AnchorScheduler(fraction=0.25, seed=0)
        >>> sorted(s.begin_step("abcdefgh", priority={"c": 0.9, "f": 0.8}))
        ['c', 'f']
        """
        ids = self._new_step(group_ids, "begin_step")
        slots = self._choose(len(ids), floor=True)
        if priority is not None:
            # same count, same draws; the seeded order (anchors first) breaks ties
            order = sorted(range(len(ids)), key=lambda i: (-float(priority.get(ids[i], -math.inf)), not slots[i]))
            chosen = set(order[: sum(slots)])
            slots = [i in chosen for i in range(len(ids))]
        return self._record_step(ids, slots)

    def defer(self, group_ids: Iterable[Hashable]) -> None:
        """Announce a training step's groups without deciding them (informative selection):
        :meth:`assign` answers ``None`` for them until :meth:`decide` has.

        >>> s = AnchorScheduler(fraction=0.5, seed=0)
        >>> s.defer(["a", "b"]); s.assign("a") is None
        True
        >>> s.decide({"a": None, "b": 0.3})  # "a" is not worth grading for real
        frozenset({'b'})
        """
        self._deferred.update(self._new_step(group_ids, "defer"))

    def decide(self, candidates: Mapping[Hashable, float | None], *, fill: bool = False) -> frozenset:
        """Decide deferred groups now; returns the anchors among them.

        ``candidates`` maps each group to decide to its priority (higher = more worth
        grading for real) or ``None`` (not worth it). The number of anchors is
        :meth:`begin_step`'s for a step of ``len(candidates)`` groups; the highest priorities
        win (ties in the seeded random order). Without ``fill`` the count is capped by the
        groups with a priority (a ``None`` group is never an anchor); with ``fill`` the
        ``None`` groups come last and fill the rest (see the module docstring). Groups not
        deferred are refused: a decision is made once.

        >>> s = AnchorScheduler(fraction=0.5, seed=0)
        >>> s.defer(["a", "b"]); sorted(s.decide({"a": None, "b": None}, fill=True))
        ['a']
        """
        ids = list(candidates)
        stray = [gid for gid in ids if gid not in self._deferred]
        if stray:
            raise ValueError(f"decide: groups {stray!r} were not deferred (or were decided already)")
        eligible = [i for i, gid in enumerate(ids) if candidates[gid] is not None]
        slots = self._choose(len(ids), floor=True, most=len(ids) if fill else len(eligible))
        # groups with a priority first, highest first; the seeded draws of _choose break ties
        ranked = range(len(ids)) if fill else eligible
        order = sorted(
            ranked, key=lambda i: (candidates[ids[i]] is None, -float(candidates[ids[i]] or 0.0), not slots[i])
        )
        chosen = set(order[: sum(slots)])
        self._deferred.difference_update(ids)
        return self._record_step(ids, [i in chosen for i in range(len(ids))])

    def _new_step(self, group_ids: Iterable[Hashable], caller: str) -> list[Hashable]:
        """A step's distinct ids, each released from an earlier decision; drops the lazy plan."""
        ids = list(group_ids)
        if len(set(ids)) != len(ids):
            raise ValueError(f"{caller}: group ids must be distinct within a step, got {ids!r}")
        for gid in ids:
            self.release(gid)
        self._plan = []
        return ids

    def _record_step(self, ids: list[Hashable], slots: list[bool]) -> frozenset:
        for gid, is_anchor in zip(ids, slots):
            self._record(gid, is_anchor)
        return frozenset(gid for gid, is_anchor in zip(ids, slots) if is_anchor)

    def assign(self, group_id: Hashable) -> bool | None:
        """The decision for ``group_id``: an earlier one if it exists, ``None`` if it is
        deferred (see :meth:`defer`), else the next lazy slot."""
        if group_id in self._deferred:
            return None
        if group_id in self._decisions:
            return self._decisions[group_id]
        if not self._plan:
            self._plan = self._choose(self.groups_per_step or 1, floor=self.groups_per_step is not None)
        # The plan took the free concurrency slots into account when it was made, and
        # only its own assignments open anchors until it is used up (begin_step drops it).
        is_anchor = self._plan.pop(0)
        self._record(group_id, is_anchor)
        return is_anchor

    def decision(self, group_id: Hashable) -> bool | None:
        """The decision for ``group_id``, or ``None`` if it has none (not decided, deferred or released)."""
        return self._decisions.get(group_id)

    def release(self, group_id: Hashable) -> None:
        """Forget a finished group; frees its concurrency slot if it was an anchor. A deferred
        group released undecided is dropped without counting as a group."""
        self._deferred.discard(group_id)
        self._decisions.pop(group_id, None)
        self._open.discard(group_id)

    def _record(self, group_id: Hashable, is_anchor: bool) -> None:
        self._decisions[group_id] = is_anchor
        self.n_groups += 1
        if is_anchor:
            self.n_anchors += 1
            self._open.add(group_id)

    def _choose(self, n: int, *, floor: bool, most: int | None = None) -> list[bool]:
        """Anchor flags for ``n`` group slots (one step), at most ``most`` of them set."""
        self.n_steps += 1
        if n == 0 or self.fraction == 0.0:
            return [False] * n
        # Error diffusion: aim at the cumulative target, so earlier rounding (and the floor
        # or the cap) is paid back in later steps.
        target = self.fraction * (self.n_groups + n) - self.n_anchors
        count = int(math.floor(target + self._rng.random()))
        count = min(max(count, 0), n)
        if floor:
            count = max(count, min(self.min_per_step, n))
        if self.max_concurrent is not None:
            count = min(count, max(self.max_concurrent - len(self._open), 0))
        if most is not None:
            count = min(count, most)
        chosen = set(self._rng.permutation(n)[:count].tolist())
        return [i in chosen for i in range(n)]

    # -- persistence ---------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state: generator, counters, open decisions, lazy plan."""
        return {
            "version": _STATE_VERSION,
            "config": {
                "fraction": self.fraction,
                "min_per_step": self.min_per_step,
                "max_concurrent": self.max_concurrent,
                "seed": self.seed,
                "groups_per_step": self.groups_per_step,
            },
            "rng": self._rng.bit_generator.state,
            "n_groups": self.n_groups,
            "n_anchors": self.n_anchors,
            "n_steps": self.n_steps,
            "decisions": [[gid, flag] for gid, flag in self._decisions.items()],
            "deferred": sorted(self._deferred, key=repr),
            "open": sorted(self._open, key=repr),  # a set: one order for the same members, run to run
            "plan": list(self._plan),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (the config must match this scheduler's)."""
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"AnchorScheduler state version {state.get('version')!r} != {_STATE_VERSION}")
        mine = self.state_dict()["config"]
        if state["config"] != mine:
            raise ValueError(f"AnchorScheduler config mismatch: saved {state['config']!r}, this one {mine!r}")
        self._rng.bit_generator.state = state["rng"]
        self.n_groups = int(state["n_groups"])
        self.n_anchors = int(state["n_anchors"])
        self.n_steps = int(state["n_steps"])
        self._decisions = {json_key(gid): bool(flag) for gid, flag in state["decisions"]}
        self._open = {json_key(gid) for gid in state["open"]}
        self._deferred = {json_key(gid) for gid in state.get("deferred", [])}  # absent before informative selection
        self._plan = [bool(x) for x in state["plan"]]


def informative_priority(
    members: Sequence[tuple[Any, Any]],
    *,
    least_confident: bool = False,
    calibrate: ScoreTransform | None = None,
) -> float | None:
    """A group's priority for informative selection, from its members' ``(graded action,
    raw world-model outcome)``: ``None`` when fewer than two distinct actions are graded
    (every member wrote the same script, so their real scores are equal and the group can
    neither move the calibration's within-group ranking nor the denoising weight), else a
    base of 0 (every such group alike: the seeded order decides) or, with ``least_confident``,
    the world model's mean uncertainty ``1 - metrics["confidence"]`` over the members that
    report a confidence (0 when none does); plus 1 when the members' scores *as they will be
    calibrated* (``calibrate``: the map in force, e.g. the world-model layer's
    ``score_transform``; ``None``: the raw scores) take two or more values.

    Why the calibrated spread comes first: a group is informative only with a spread in both
    its calibrated and its real scores, and the calibrated side is known at the decision.
    Distinct scripts can still share one calibrated score -- the isotonic map's flat steps
    merge distinct raw scores -- and 4 of the 5 uninformative anchor groups of a full-budget
    run were such groups (docs/results/informative-anchor-diagnosis/). They stay eligible,
    after every group with a calibrated spread: a map fitted on few pairs is flat almost
    everywhere, and passing such groups over could leave it with no anchors to refit on.
    Measured on two seeds, the ranking did not raise the informative share by itself (pooled
    0.58 before, 0.60 after: a collapsed policy's steps rarely offer a better group).

    Why not least-confident by default: anchor pairs from where the model is unsure are a
    biased sample of its score range, and an isotonic map fitted on them extrapolates badly
    (measured offline: calibrated MAE 0.115 with low-confidence anchors vs 0.084 with random
    ones; docs/results.md, "Confidence and anchors").

    >>> informative_priority([("fit()", None), ("fit()", None)]) is None
    True
    >>> from wmrl_envs.outcome import Outcome
    >>> sure, unsure = (Outcome("valid", 0.8, metrics={"confidence": c}) for c in (0.9, 0.5))
    >>> informative_priority([("a", sure), ("b", unsure)]), round(informative_priority([("a", sure), ("b", unsure)], least_confident=True), 3)
    (0.0, 0.3)
    >>> low, high = Outcome("valid", 0.6), Outcome("valid", 0.7)
    >>> informative_priority([("a", low), ("b", high)])  # a calibrated spread
    1.0
    >>> informative_priority([("a", low), ("b", high)], calibrate=lambda s: [0.65 for _ in s])  # a flat step
    0.0
    """
    graded = [(action, outcome) for action, outcome in members if action is not None]
    if len({str(action) for action, _ in graded}) < 2:
        return None
    raw = [getattr(outcome, "score", None) for _, outcome in graded]
    known = [s for s in (calibrate(raw) if calibrate is not None else raw) if s is not None]
    spread = 1.0 if len(set(known)) >= 2 else 0.0
    if not least_confident:
        return spread
    confidences = [
        float(c)
        for _, o in graded
        if o is not None and isinstance(c := getattr(o, "metrics", {}).get("confidence"), (int, float))
    ]
    return spread + (1.0 - float(np.mean(confidences)) if confidences else 0.0)
