"""Anchor groups: a thin, seeded stream of groups graded for real as well as by the world model.

Groups are GRPO groups: ``n`` separate episodes (members) that share a task instance and
the anchor decision. A member joins its group at reset::

    env.reset(options={"task": ..., "group_id": g, "group_size": n})

``group_size`` is consumed by this wrapper (not passed to the env); it tells the wrapper
when a group is complete (all ``n`` members finished), which frees the group's
concurrency slot and emits ``group_result`` for the calibration layer. Without it the
wrapper's ``group_size`` default applies (single form: ``None`` = open-ended, the group
never completes; vector form: the number of sub-envs reset together with that id). A
reset without ``group_id`` (e.g. a plain SB3 loop, or a vector autoreset) puts the
episode in an automatic group ``"auto-<k>"`` of ``auto_group_size`` consecutive such
episodes (default 1: singletons, which feed Online Debiasing but not Inverse-Variance
Denoising, which needs >= 2 members per group). With ``anchor_auto_groups=False``
automatic groups are never anchors and do not count toward the realized fraction: use it
when a trainer schedules its groups itself and id-less episodes are only filler (e.g.
sub-envs autoresetting while a GRPO rollout idles its finished slots). A reused id after
its group completed is a new group. An episode abandoned by a reset before it ended
counts as a finished member with unknown scores.

Anchor members run the :class:`~wrappers.world_model.WorldModelWrapper` below in mode
``"both"``, the others in ``"wm"``. The decision comes from an
:class:`~wrappers.parts.scheduling.AnchorScheduler`: trainers may decide a whole training step
at once with :meth:`AnchorWrapper.begin_step`; otherwise decisions are made lazily at
each new group's first reset.

With ``selection="informative"`` (vector form) a step's groups are decided at their first
*step* instead, once every member's action is known: the world model previews the actions
(its predictions are reused by the step, not made twice), and the anchors are drawn first
from the groups with two or more distinct scripts whose scores, calibrated by the map in
force, differ, then from the other groups with two or more distinct scripts (the isotonic
map's flat steps can give distinct scripts one calibrated score); a group whose members all
wrote the same script (real scores equal: nothing for the within-group ranking or the
denoising weight to learn) is graded for real only to make up a step's share when too few others exist
(``keep_share``, the default), so a policy collapsed onto one script stays watched.
``selection="least-confident"`` prefers the world model's least confident of those
(:func:`~wrappers.parts.scheduling.informative_priority`). Resets of such a group leave
``anchor`` out (undecided); its steps report the decision.

With ``overlap=True`` anchor members are graded by the world model at step time and for
real in background threads, so their real runs overlap the rest of the training step;
results land through :meth:`AnchorWrapper.collect` (see :mod:`wrappers.anchor_overlap`
for the staleness bound and what changes for anchor members).

Classes: :class:`AnchorWrapper`, :class:`VectorAnchorWrapper`, :class:`GroupBook`.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.utils import RecordConstructorArgs
from gymnasium.vector import VectorEnv, VectorWrapper

from wrappers._common import VectorSteps, json_key, known_info, put_info, require_layer, sub_info
from wrappers._record import record_constructor_args
from wrappers.anchor_overlap import BackgroundGrader
from wrappers.parts.scheduling import SELECTIONS, AnchorScheduler, informative_priority
from wrappers.world_model import ScoreTransform, VectorWorldModelWrapper, WorldModelWrapper

__all__ = ["AnchorWrapper", "VectorAnchorWrapper", "GroupBook"]


class GroupBook:
    """Membership of open groups: who joined, who finished with which scores.

    >>> book = GroupBook()
    >>> book.join("g", 2)
    True
    >>> book.join("g", 2), book.finish("g", 0.4, 0.5)
    (False, None)
    >>> book.finish("g", 0.6, 0.9)["true"]
    [0.5, 0.9]
    """

    def __init__(self) -> None:
        self._groups: dict[Hashable, dict[str, Any]] = {}

    def __contains__(self, group_id: Hashable) -> bool:
        return group_id in self._groups

    def join(self, group_id: Hashable, size: int | None) -> bool:
        """Add a member; returns True if this starts a new group."""
        if size is not None and (not isinstance(size, (int, np.integer)) or size < 1):
            raise ValueError(f"group_size must be an int >= 1 or None, got {size!r}")
        group = self._groups.get(group_id)
        if group is None:
            self._groups[group_id] = {
                "size": None if size is None else int(size),
                "joined": 1,
                "calibrated": [],
                "true": [],
            }
            return True
        if size is not None and group["size"] != size:
            raise ValueError(f"group {group_id!r} was opened with group_size={group['size']}, now {size}")
        if group["size"] is not None and group["joined"] >= group["size"]:
            raise ValueError(f"group {group_id!r} already has its {group['size']} members")
        group["joined"] += 1
        return False

    def has_room(self, group_id: Hashable) -> bool:
        """True if ``group_id`` is open and still short of members."""
        group = self._groups.get(group_id)
        return group is not None and (group["size"] is None or group["joined"] < group["size"])

    def finish(self, group_id: Hashable, calibrated: float | None, true: float | None) -> dict[str, Any] | None:
        """Record a finished member; returns the group's result when it is complete (and closes it)."""
        group = self._groups[group_id]
        group["calibrated"].append(calibrated)
        group["true"].append(true)
        if group["size"] is None or len(group["true"]) < group["size"]:
            return None
        del self._groups[group_id]
        return {"group_id": group_id, "calibrated": group["calibrated"], "true": group["true"]}

    def state_dict(self) -> list[list[Any]]:
        return [[gid, dict(g)] for gid, g in self._groups.items()]

    def load_state_dict(self, state: Iterable[list[Any]]) -> None:
        self._groups = {json_key(gid): dict(g) for gid, g in state}


@dataclass
class _Member:
    """The episode running in one slot (a single env has one slot; a vector env one per sub-env)."""

    group_id: Hashable
    anchor: bool | None  # None: the group's decision waits for its first step (informative selection)
    calibrated: float | None = None  # running max over graded turns (trajectory reward = max)
    true: float | None = None
    # overlap mode (anchor members only):
    ticket: int | None = None  # identifies the member's background real gradings
    pending: int = 0  # real gradings in flight
    graded: int = 0  # real gradings submitted
    fixed: float | None = None  # max score of ungraded turns (malformed / syntax error), known at once
    ended: bool = False
    real_outcomes: list[Any] = field(default_factory=list)


def _max(a: float | None, b: float | None) -> float | None:
    return a if b is None else (b if a is None else max(a, b))


#: The keys of the world-model layer's info that the anchor layer reads.
_READS = ("wm_score", "calibrated_score", "true_score", "outcome")

#: Most completed overlap records kept for :meth:`AnchorWrapper.collect` (a loop that never
#: collects does not grow memory without bound; pairs and group results do not depend on it).
_RECORDS_KEPT = 10_000


class _AnchorCore:
    """Group bookkeeping and anchor decisions for any number of slots (both forms)."""

    def __init__(
        self,
        scheduler: AnchorScheduler,
        num_slots: int,
        set_mode: Callable[[int, str], None],
        auto_group_size: int,
        anchor_auto_groups: bool,
        selection: str = "random",
        keep_share: bool = True,
    ) -> None:
        if not isinstance(auto_group_size, int) or auto_group_size < 1:
            raise ValueError(f"auto_group_size must be an int >= 1, got {auto_group_size!r}")
        if selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {SELECTIONS}, got {selection!r}")
        self.selection = selection
        self.keep_share = keep_share
        self.scheduler = scheduler
        self.book = GroupBook()
        self.members: list[_Member | None] = [None] * num_slots
        self._set_mode = set_mode
        self.auto_group_size = auto_group_size
        self.anchor_auto_groups = anchor_auto_groups
        self._auto = 0  # automatic groups opened so far
        self._graded: set[Hashable] = set()  # open groups with a member already graded by the world model
        #: Called with no argument at every :meth:`begin_step` (the calibration layer's step boundary).
        self.step_listeners: list[Callable[[], object]] = []  # return values are ignored
        #: Overlap mode: called with ``{"anchor_pairs": [...], "group_result": ...}`` whenever
        #: background real gradings land (the calibration layer feeds its calibrator).
        self.landing_listeners: list[Callable[[Mapping[str, Any]], object]] = []
        self.overlap = False
        self._tickets = 0
        self._by_ticket: dict[int, _Member] = {}  # overlap anchor members not yet closed
        self.completed: collections.deque[dict[str, Any]] = collections.deque(maxlen=_RECORDS_KEPT)

    def begin_step(self, group_ids: Iterable[Hashable], priority: Mapping[Hashable, float] | None = None) -> frozenset:
        """Decide a training step's groups at once (informative selection: announce them,
        undecided), then tell the step listeners."""
        if self.selection != "random":
            self.scheduler.defer(group_ids)
            anchors: frozenset = frozenset()
        else:
            anchors = self.scheduler.begin_step(group_ids, priority)
        for listener in self.step_listeners:
            listener()
        return anchors

    @property
    def graded_groups_open(self) -> bool:
        """True while some open group has a member already graded by the world model (so a
        new calibration map now would calibrate that group's members by two maps)."""
        return bool(self._graded)

    def start(self, slot: int, group_id: Hashable | None, size: int | None) -> dict[str, Any]:
        """A new episode in ``slot``; returns the info keys for its reset."""
        extra: dict[str, Any] = {}
        if self.members[slot] is not None:  # abandoned before it ended
            result = self._finish(slot)
            if result is not None:
                extra["group_result"] = result
        scheduled = group_id is not None or self.anchor_auto_groups
        if group_id is None:
            group_id, size = self._auto_group(), self.auto_group_size
        self.book.join(group_id, size)
        anchor = self.scheduler.assign(group_id) if scheduled else False
        member = self.members[slot] = _Member(group_id, anchor)
        self._apply(slot, member, anchor)
        extra.update(group_id=group_id, anchor=anchor, anchor_fraction=self.scheduler.realized_fraction)
        if member.ticket is not None:
            extra["anchor_ticket"] = member.ticket
        return extra

    def _apply(self, slot: int, member: _Member, anchor: bool | None) -> None:
        """Give ``slot``'s member its decision (``None``: undecided, graded like the others)."""
        member.anchor = anchor
        # overlap: anchors are graded by the world model in step, for real in the background
        self._set_mode(slot, "both" if anchor and not self.overlap else "wm")
        if anchor and self.overlap:
            member.ticket = self._tickets
            self._tickets += 1
            self._by_ticket[member.ticket] = member

    def decide(
        self,
        slots: Iterable[int],
        preview: Callable[[list[int]], Mapping[int, tuple[Any, Any]]],
        calibrate: ScoreTransform | None = None,
    ) -> None:
        """Informative selection, before a step of ``slots``: decide the groups of their
        undecided members from ``preview(slots) -> {slot: (graded action, raw outcome)}``
        (the world model's predictions of the actions about to be graded) and ``calibrate``,
        the map their raw scores will be calibrated by (``None``: none). A member whose
        group was decided meanwhile (at a sibling's step) just takes the decision."""
        undecided = [i for i in slots if (m := self.members[i]) is not None and m.anchor is None]
        if not undecided:
            return
        groups: dict[Hashable, list[int]] = {}
        for i in undecided:
            member = self.members[i]
            assert member is not None  # filtered above
            known = self.scheduler.decision(member.group_id)
            if known is None:
                groups.setdefault(member.group_id, []).append(i)
            else:
                self._apply(i, member, known)
        if not groups:
            return
        previewed = preview([i for group in groups.values() for i in group])
        least_confident = self.selection == "least-confident"
        priority = {
            g: informative_priority(
                [previewed.get(i, (None, None)) for i in group], least_confident=least_confident, calibrate=calibrate
            )
            for g, group in groups.items()
        }
        anchors = self.scheduler.decide(priority, fill=self.keep_share)
        for g, group in groups.items():
            for i in group:
                member = self.members[i]
                assert member is not None
                self._apply(i, member, g in anchors)

    def overlap_ticket(self, slot: int) -> int | None:
        """The ticket of ``slot``'s member if its real gradings run in the background."""
        member = self.members[slot]
        return None if member is None else member.ticket

    def step(self, slot: int, info: Mapping[str, Any], ended: bool, deferred: bool = False) -> dict[str, Any]:
        """Info keys for a step of ``slot``'s episode (``info``: what the layers below
        reported; ``deferred``: this step's request is being graded for real in the background)."""
        member = self.members[slot]
        if member is None:
            raise RuntimeError("AnchorWrapper: step before reset")
        wm, cal, true = info.get("wm_score"), info.get("calibrated_score"), info.get("true_score")
        member.calibrated = _max(member.calibrated, cal)
        member.true = _max(member.true, true)
        if wm is not None or deferred:
            self._graded.add(member.group_id)
        if deferred:
            member.pending += 1
            member.graded += 1
        elif member.ticket is not None:  # an ungraded turn's own score (malformed reply, syntax error)
            outcome = info.get("outcome")
            member.fixed = _max(member.fixed, getattr(outcome, "score", None))
        extra: dict[str, Any] = {
            "group_id": member.group_id,
            "anchor": member.anchor,
            "anchor_pairs": [(wm, true)] if member.anchor and wm is not None and true is not None else [],
            "anchor_fraction": self.scheduler.realized_fraction,
        }
        if member.ticket is not None:
            extra["anchor_ticket"] = member.ticket
        if ended:
            result = self._finish(slot)
            if result is not None:
                extra["group_result"] = result
        return extra

    def _auto_group(self) -> str:
        """The open automatic group if it still has room, else a new one."""
        current = f"auto-{self._auto - 1}"
        if self._auto and self.book.has_room(current):
            return current
        self._auto += 1
        return f"auto-{self._auto - 1}"

    def _finish(self, slot: int) -> dict[str, Any] | None:
        member = self.members[slot]
        assert member is not None  # only finished slots that hold a member
        self.members[slot] = None
        member.ended = True
        if member.pending:  # real gradings in flight: the member closes when they land
            return None
        return self._close(member)

    def _close(self, member: _Member) -> dict[str, Any] | None:
        result = self.book.finish(member.group_id, member.calibrated, member.true)
        if result is not None:
            result["anchor"] = bool(member.anchor)  # a group that never stepped was never decided: not an anchor
            self.scheduler.release(member.group_id)
            self._graded.discard(member.group_id)
        if member.ticket is not None:
            self._by_ticket.pop(member.ticket, None)
            self.completed.append(
                {
                    "ticket": member.ticket,
                    "group_id": member.group_id,
                    "graded": member.graded,
                    "true": member.true,
                    "reward": _max(member.fixed, member.true) if member.graded else None,
                    "real_outcomes": list(member.real_outcomes),
                    "group_result": result,
                }
            )
        return result

    def land(self, ticket: int, wm_score: float | None, outcome: Any) -> None:
        """A background real grading of member ``ticket`` finished: feed the landing
        listeners its pair, and its group's result once the group is complete."""
        member = self._by_ticket.get(ticket)
        if member is None:  # the member was dropped by load_state_dict; its pair still counts
            true = getattr(outcome, "score", None)
            info: dict[str, Any] = {"anchor_pairs": [(wm_score, true)] if None not in (wm_score, true) else []}
        else:
            true = getattr(outcome, "score", None)
            member.pending -= 1
            member.true = _max(member.true, true)
            member.real_outcomes.append(outcome)
            info = {"anchor_pairs": [(wm_score, true)] if None not in (wm_score, true) else []}
            if member.ended and not member.pending:
                result = self._close(member)
                if result is not None:
                    info["group_result"] = result
        for listener in self.landing_listeners:
            listener(info)

    def state_dict(self) -> dict[str, Any]:
        return {
            "scheduler": self.scheduler.state_dict(),
            "groups": self.book.state_dict(),
            "auto": self._auto,
            "graded": list(self._graded),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.scheduler.load_state_dict(state["scheduler"])
        self.book.load_state_dict(state["groups"])
        self._auto = int(state["auto"])
        self._graded = {json_key(g) for g in state.get("graded", [])}
        self.members = [None] * len(self.members)  # episodes in flight died with the old process
        self._by_ticket = {}


_INFO_DOC = """
    Info keys added (reset: ``group_id``, ``anchor``, ``anchor_fraction``, and ``group_result``
    when the reset abandoned the last unfinished member of a group; every step also):

    * ``group_id``: the member's group (``"auto-<k>"`` for a reset without one).
    * ``anchor``: True if the group is an anchor group (graded for real, mode ``"both"``);
      left out at the reset of a group whose decision waits for its first step
      (``selection="informative"`` / ``"least-confident"``).
    * ``anchor_pairs``: this step's ``[(wm_score, true_score)]`` on anchor groups when both
      are known, else ``[]`` (``wm_score`` is the raw, uncalibrated world-model score).
    * ``anchor_fraction``: realized fraction of anchor groups so far.
    * ``group_result`` (only on the step that completes a group): ``{"group_id", "anchor",
      "calibrated": [...], "true": [...]}``, one entry per member: its max calibrated
      world-model score and max true score over its graded turns (``None`` if unknown).
    * ``anchor_ticket`` (overlap mode, anchor members): identifies the member in the records
      :meth:`collect` returns. With overlap, an anchor member's steps report its world-model
      grading (``source="wm"``) and no pairs; pairs and its group's result go to the
      calibration layer when its real runs land.
"""


class _AnchorBase:
    _core: _AnchorCore
    _background: BackgroundGrader | None = None
    _wm_layer: Any = None

    @property
    def scheduler(self) -> AnchorScheduler:
        return self._core.scheduler

    @property
    def selection(self) -> str:
        """How anchor groups are chosen: one of :data:`~wrappers.parts.scheduling.SELECTIONS`."""
        return self._core.selection

    @property
    def overlap(self) -> bool:
        """True if anchor groups are graded for real in the background (see :meth:`collect`)."""
        return self._background is not None

    def _setup_overlap(self, overlap: bool, grader: Callable[[Any], Any] | None, workers: int, wm: Any) -> None:
        self._wm_layer = wm
        if not overlap:
            return
        if grader is None:
            raise ValueError(
                f"{type(self).__name__}(overlap=True) needs grader= here (the env's grade(request)): "
                "the sub-envs are not reachable from this process"
            )
        self._background = BackgroundGrader(grader, workers)
        self._core.overlap = True

    def collect(self, wait: bool = False) -> list[dict[str, Any]]:
        """Overlap mode: land the background real gradings that finished (all of them with
        ``wait``) and return the records of anchor members now complete, one dict each:
        ``ticket`` (the member's ``info["anchor_ticket"]``), ``group_id``, ``graded`` (real
        gradings it had), ``reward`` (its trajectory reward from real outcomes: max over
        turns; ``None`` if it had no graded turn), ``true`` (max real score), ``real_outcomes``
        and ``group_result`` (set on the member that completed its group). Pairs and group
        results already went to the calibration layer. ``[]`` without overlap."""
        if self._background is None:
            return []
        for landing in self._background.landed(wait=wait):
            if self._wm_layer is not None:
                self._wm_layer._grader.count_real(1, landing.seconds)
                self._wm_layer._grader.anchor_graded(landing.request, landing.outcome)
            self._core.land(landing.ticket, landing.wm_score, landing.outcome)
        out = list(self._core.completed)
        self._core.completed.clear()
        return out

    def _land_ready(self) -> None:
        """Land what finished, keeping the member records for :meth:`collect`."""
        if self._background is not None and self._background.in_flight:
            records = self.collect(wait=False)
            self._core.completed.extend(records)

    def begin_step(self, group_ids: Iterable[Hashable], priority: Mapping[Hashable, float] | None = None) -> frozenset:
        """Decide a training step's groups at once (see :meth:`AnchorScheduler.begin_step`).

        This is also the step boundary of the calibration layer above, which refits its map
        (when due) here, so that no group is calibrated by two maps. With overlap, every
        real grading still in flight lands first (the staleness bound).

        ``priority`` (off by default): prefer some groups as anchors, e.g. those whose world
        model predictions are least confident -- ``{g: 1 - mean(o.metrics["confidence"])}``
        over a group's predicted outcomes (a trainer that has the members' actions before
        the step can ask the world model for them); the anchor count is unchanged."""
        if self._background is not None:
            self._core.completed.extend(self.collect(wait=True))
        return self._core.begin_step(group_ids, priority)

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state: the scheduler (RNG, counters, decisions) and open groups.
        With overlap, real gradings in flight land first, so no anchor pair is lost."""
        if self._background is not None:
            self._core.completed.extend(self.collect(wait=True))
        return self._core.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._core.load_state_dict(state)


class AnchorWrapper(_AnchorBase, gym.Wrapper, RecordConstructorArgs):
    __doc__ = (
        """Marks a seeded share of GRPO groups as anchors, graded for real as well as by the world model.

    Wrap a :class:`~wrappers.world_model.WorldModelWrapper` (directly or with other
    wrappers between). See the module docstring for how groups are identified.

    Args:
        env: the stack below, containing a ``WorldModelWrapper``.
        fraction, min_per_step, max_concurrent, seed, groups_per_step: the
            :class:`~wrappers.parts.scheduling.AnchorScheduler`'s (``fraction=0.10``,
            ``min_per_step=1``, ``max_concurrent=None``, ``seed=0`` are the paper's defaults).
        group_size: members per group when ``reset`` options give a ``group_id`` but no
            ``group_size`` (``None``: open-ended groups, which never complete).
        auto_group_size: members of the automatic groups formed by resets without a
            ``group_id`` (default 1).
        anchor_auto_groups: whether automatic groups are scheduled like the others
            (default True; see the module docstring).
        overlap: grade anchor members for real in background threads instead of inside
            ``step`` (see :mod:`wrappers.anchor_overlap`); results land via :meth:`collect`.
        grader: overlap mode's real grader, ``request -> Outcome | None`` (default: the
            env's own ``grade``).
        overlap_workers: real gradings at once in overlap mode.
"""
        + _INFO_DOC
        + """
    Example (``env`` an OutcomeSeam env, ``wm`` a world model)::

        env = AnchorWrapper(WorldModelWrapper(env, wm), fraction=0.1, seed=0)
        env.begin_step(range(32))                 # optional: decide a training step at once
        obs, info = env.reset(options={"group_id": 3, "group_size": 8})
        info["anchor"]                            # same for all 8 members of group 3
"""
    )

    def __init__(
        self,
        env: gym.Env,
        fraction: float = 0.10,
        min_per_step: int = 1,
        max_concurrent: int | None = None,
        seed: int = 0,
        groups_per_step: int | None = None,
        group_size: int | None = None,
        auto_group_size: int = 1,
        anchor_auto_groups: bool = True,
        overlap: bool = False,
        grader: Callable[[Any], Any] | None = None,
        overlap_workers: int = 2,
    ) -> None:
        record_constructor_args(
            self, fraction=fraction, min_per_step=min_per_step, max_concurrent=max_concurrent, seed=seed,
            groups_per_step=groups_per_step, group_size=group_size, auto_group_size=auto_group_size,
            anchor_auto_groups=anchor_auto_groups, overlap=overlap, grader=grader, overlap_workers=overlap_workers,
        )  # fmt: skip
        super().__init__(env)
        wm = require_layer(env, WorldModelWrapper, needed_by="AnchorWrapper")
        scheduler = AnchorScheduler(fraction, min_per_step, max_concurrent, seed, groups_per_step)
        self.group_size = group_size

        def set_mode(_: int, mode: str) -> None:
            wm.mode = mode

        self._core = _AnchorCore(scheduler, 1, set_mode, auto_group_size, anchor_auto_groups)
        if overlap and grader is None:
            grader = env.get_wrapper_attr("grade")
        self._setup_overlap(overlap, grader, overlap_workers, wm)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        options = dict(options or {})
        size = options.pop("group_size", self.group_size)
        obs, info = self.env.reset(seed=seed, options=options)  # first: a refused reset joins no group
        self._land_ready()
        return obs, {**info, **known_info(self._core.start(0, options.get("group_id"), size))}

    def step(self, action: Any):
        ticket = self._core.overlap_ticket(0)
        request = None if ticket is None else self.env.get_wrapper_attr("grading_request")(action)
        obs, reward, terminated, truncated, info = self.env.step(action)
        if request is not None:
            assert self._background is not None and ticket is not None  # tickets exist only in overlap mode
            self._background.submit(ticket, request, info.get("wm_score"))
        extra = self._core.step(0, info, bool(terminated or truncated), deferred=request is not None)
        self._land_ready()
        return obs, reward, terminated, truncated, {**info, **known_info(extra)}

    def close(self) -> None:
        if self._background is not None:
            self._background.close()
        super().close()


class VectorAnchorWrapper(_AnchorBase, VectorWrapper, RecordConstructorArgs):
    __doc__ = (
        """The vector form of :class:`AnchorWrapper` (wraps a
    :class:`~wrappers.world_model.VectorWorldModelWrapper`).

    ``reset(options={"group_id": g, "group_size": n, "reset_mask": mask})``: the sub-envs
    in ``mask`` (all without one) join group ``g``; ``group_size`` defaults to the number of
    sub-envs reset together. To run several groups side by side, reset each group's
    sub-envs with its own ``reset_mask`` call. Episodes begun by autoreset (or reset
    without a ``group_id``) join automatic groups ``"auto-<k>"`` of ``auto_group_size``.

    Args: as :class:`AnchorWrapper`, except ``group_size`` (see above), plus
        selection: ``"random"`` (default; the paper's: groups decided when the trainer
            announces the step, before any member is sampled), ``"informative"`` or
            ``"least-confident"`` (decided at a group's first step, from the world model's
            preview of its members' actions: see the module docstring). These need a group's
            members to take their first step together, as :class:`agents.llm.rollout.Rollout`
            does; the single form cannot see a group at once, so it has only ``"random"``.
        keep_share: informative selections only: when a step has fewer groups with two or
            more distinct scripts than its share of anchors, grade groups of one script for
            real to make up the rest (default), so the realised share stays on target and a
            policy collapsed onto one script is still checked against real execution.
            ``False``: pass such groups over and carry the deficit to later steps (the
            share falls below target for as long as the policy stays collapsed).
"""
        + _INFO_DOC
        + """
    Keys are per sub-env with ``_key`` masks; with same-step autoreset the step keys of an
    episode's last step are in ``info["final_info"]``.
"""
    )

    def __init__(
        self,
        env: VectorEnv,
        fraction: float = 0.10,
        min_per_step: int = 1,
        max_concurrent: int | None = None,
        seed: int = 0,
        groups_per_step: int | None = None,
        auto_group_size: int = 1,
        anchor_auto_groups: bool = True,
        overlap: bool = False,
        grader: Callable[[Any], Any] | None = None,
        overlap_workers: int = 2,
        selection: str = "random",
        keep_share: bool = True,
    ) -> None:
        record_constructor_args(
            self, fraction=fraction, min_per_step=min_per_step, max_concurrent=max_concurrent, seed=seed,
            groups_per_step=groups_per_step, auto_group_size=auto_group_size, anchor_auto_groups=anchor_auto_groups,
            overlap=overlap, grader=grader, overlap_workers=overlap_workers, selection=selection,
            keep_share=keep_share,
        )  # fmt: skip
        super().__init__(env)
        wm = require_layer(env, VectorWorldModelWrapper, needed_by="VectorAnchorWrapper")
        scheduler = AnchorScheduler(fraction, min_per_step, max_concurrent, seed, groups_per_step)
        self._core = _AnchorCore(
            scheduler, self.num_envs, wm.set_mode, auto_group_size, anchor_auto_groups, selection, keep_share
        )
        self._steps = VectorSteps(env)
        if overlap and grader is None:  # a SyncVectorEnv's first sub-env grades any request
            sub_envs = getattr(env.unwrapped, "envs", None)
            grader = getattr(sub_envs[0].unwrapped, "grade", None) if sub_envs else None
        self._setup_overlap(overlap, grader, overlap_workers, wm)

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None):
        options = dict(options or {})
        mask = self._steps.on_reset(options.get("reset_mask"))
        slots = np.flatnonzero(mask).tolist()
        group_id = options.get("group_id")
        size = options.pop("group_size", len(slots) if group_id is not None else None)
        # first: a refused reset joins no group
        obs, infos = self.env.reset(seed=seed, options=options)  # type: ignore[arg-type]  # gymnasium types seed int | None; vector envs take lists

        self._land_ready()
        for i in slots:
            put_info(infos, self.num_envs, i, self._core.start(i, group_id, size))
        return obs, infos

    def _overlap_requests(self, stepped: np.ndarray, actions: Any) -> dict[int, tuple[int, Any]]:
        """Overlap mode: ``{slot: (ticket, request)}`` of the anchor members graded this step."""
        tickets = {i: t for i in np.flatnonzero(stepped).tolist() if (t := self._core.overlap_ticket(i)) is not None}
        if not tickets:
            return {}
        from gymnasium.vector.utils import iterate

        seam_env: Any = self.env.unwrapped  # the vector env of the sub-envs (wrappers do not forward call)
        seam_env.set_attr(
            "pending_action", [a if stepped[i] else None for i, a in enumerate(iterate(self.action_space, actions))]
        )
        requests = seam_env.call("pending_grading_request")
        return {i: (t, requests[i]) for i, t in tickets.items() if requests[i] is not None}

    def step(self, actions: Any):
        stepped = self._steps.stepped()
        if self._core.selection != "random":
            wm = self._wm_layer
            # the map in force now calibrates this step: the calibration layer refits only at step boundaries
            self._core.decide(
                np.flatnonzero(stepped).tolist(), lambda slots: wm.preview(actions, slots), wm.score_transform
            )
        deferred = self._overlap_requests(stepped, actions)
        obs, rewards, terminated, truncated, infos = self.env.step(actions)
        ended, restarted = self._steps.on_step(stepped, terminated, truncated)
        for i in np.flatnonzero(stepped).tolist():
            target = self._steps.step_info_target(infos, ended, i)
            seen = sub_info(target, i, _READS)
            if i in deferred:
                assert self._background is not None  # tickets exist only in overlap mode
                self._background.submit(deferred[i][0], deferred[i][1], seen.get("wm_score"))
            put_info(target, self.num_envs, i, self._core.step(i, seen, bool(ended[i]), deferred=i in deferred))
        self._land_ready()
        for i in np.flatnonzero(restarted).tolist():
            put_info(infos, self.num_envs, i, self._core.start(i, None, None))
        return obs, rewards, terminated, truncated, infos

    def close(self, **kwargs: Any) -> None:
        if self._background is not None:
            self._background.close()
        super().close(**kwargs)
