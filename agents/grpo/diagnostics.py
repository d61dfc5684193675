"""Warnings for training runs that look fine and cannot learn.

Two ways a GRPO run does nothing while printing plausible numbers:

* **No learning signal.** A group's advantages are all zero when its members' rewards are
  equal (every reply malformed, say) and absent when fewer than two members were graded; a
  step whose groups are all like that leaves the policy unchanged. :class:`SignalWatch` warns
  (:class:`NoLearningSignalWarning`) after ``patience`` such steps in a row, saying why and
  what to do.
* **Corrections that never engage.** WMRL's isotonic map fits only after ``start_pairs``
  anchor pairs, and the anchor weight stays 1.0 until then (with the default
  ``weighter_start``), so a run too short to collect them is the raw world model with a few
  real executions. :meth:`wrappers.StackHandle.corrections_idle` says so before the run
  starts (the loop warns with :class:`CorrectionsIdleWarning`).

Classes: :class:`NoLearningSignalWarning`, :class:`CorrectionsIdleWarning`, :class:`SignalWatch`.

>>> watch = SignalWatch(patience=2)
>>> flat = {"groups/used": 4, "groups/degenerate": 4, "groups/skipped": 0, "reward/malformed_rate": 1.0}
>>> watch.update(1, flat) is None
True
>>> print(watch.update(2, flat))  # doctest: +ELLIPSIS
no group carried a learning signal in steps 1-2 (8 groups: 8 with identical rewards, 0 with < 2 graded members; replies 100% malformed, ...
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "NoLearningSignalWarning",
    "CorrectionsIdleWarning",
    "SignalWatch",
]


class NoLearningSignalWarning(UserWarning):
    """Consecutive training steps in which no group carried a non-zero advantage."""


class CorrectionsIdleWarning(UserWarning):
    """A WMRL run whose budget cannot collect the anchor pairs the corrections need."""


def _pct(value: Any) -> str:
    return "n/a" if value is None else f"{100 * float(value):.0f}%"


class SignalWatch:
    """Counts consecutive steps without a learning signal; :meth:`update` returns the warning
    text once a streak reaches ``patience`` (then again only after a step with signal).

    Args:
        patience: steps in a row before warning (0 disables the watch).
    """

    def __init__(self, patience: int = 3) -> None:
        if patience < 0:
            raise ValueError(f"patience must be >= 0, got {patience}")
        self.patience = patience
        self.streak: list[Mapping[str, Any]] = []
        self.first_step: int | None = None
        self.warned = False
        self.steps_without_signal = 0
        #: the best share of valid replies seen so far and its step: a policy that wrote its
        #: format and then stopped has collapsed, which needs another remedy than a warm start
        self.best_valid: tuple[float, int] | None = None

    @staticmethod
    def has_signal(metrics: Mapping[str, Any]) -> bool:
        """Whether some group of the step had members with different rewards (non-zero advantages)."""
        return int(metrics.get("groups/used") or 0) - int(metrics.get("groups/degenerate") or 0) > 0

    def update(self, step: int, metrics: Mapping[str, Any]) -> str | None:
        valid = metrics.get("reward/valid_rate")
        if valid is not None and (self.best_valid is None or float(valid) > self.best_valid[0]):
            self.best_valid = (float(valid), step)
        if self.has_signal(metrics):
            self.reset()
            return None
        self.steps_without_signal += 1
        if not self.streak:
            self.first_step = step
        self.streak.append(metrics)
        if self.patience == 0 or self.warned or len(self.streak) < self.patience:
            return None
        self.warned = True
        return self.message(step)

    @property
    def collapsed(self) -> bool:
        """Whether the current streak is a collapse off the scaffold's format: replies mostly
        malformed in its last step, after a step whose replies were mostly valid."""
        if not self.streak or (self.streak[-1].get("reward/malformed_rate") or 0.0) < 0.5:
            return False
        return self.best_valid is not None and self.best_valid[0] >= 0.5

    def reset(self) -> None:
        """Forget the current streak (after a rollback the policy is another one)."""
        self.streak, self.first_step, self.warned = [], None, False

    def message(self, step: int, rolled_back: str | None = None) -> str:
        """The warning for the current streak ending at ``step``; ``rolled_back`` (what a
        :class:`~agents.grpo.rollback.FormatRollback` did about a collapse) replaces the advice."""
        total = lambda key: sum(int(m.get(key) or 0) for m in self.streak)  # noqa: E731
        used, degenerate, skipped = total("groups/used"), total("groups/degenerate"), total("groups/skipped")
        last = self.streak[-1]
        span = f"step {step}" if self.first_step == step else f"steps {self.first_step}-{step}"
        replies = (
            f"; replies {_pct(last.get('reward/malformed_rate'))} malformed, {_pct(last.get('reward/valid_rate'))} "
            "valid in the last step"
            if "reward/malformed_rate" in last  # an agent that writes replies (the LLM) reports them
            else ""
        )
        text = (
            f"no group carried a learning signal in {span} ({used + skipped} groups: {degenerate} with identical "
            f"rewards, {skipped} with < 2 graded members{replies}), so the updates change nothing"
        )
        if (last.get("reward/malformed_rate") or 0.0) >= 0.5:
            if self.collapsed:
                assert self.best_valid is not None
                rate, at = self.best_valid
                text += (
                    f". The policy has collapsed off the scaffold's format: its replies were {_pct(rate)} valid at "
                    f"step {at}. Groups of malformed replies all score the same, so nothing pulls it back (it recovers "
                    "only if a sample happens to be valid); an update on a group with one malformed member can push a "
                    "small policy there at a high learning rate"
                )
                if rolled_back is not None:
                    return f"{text}. Rolled back: {rolled_back}"
                return text + ": lower --learning-rate, or resume from an earlier checkpoint"
            return text + (
                ". The policy does not write the scaffold's format yet: warm-start it (--warm-start-steps 60, "
                "or --policy tiny-plan) or use a stronger model"
            )
        if skipped >= used:
            return text + (
                ". Most outcomes are unknown (grader or world-model failures): check the sandbox / world model"
            )
        return text + ": raise --temperature or --group-size so members of a group differ"
