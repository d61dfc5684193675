"""The world-model protocol, independent of any one env family.

A world model grades by prediction: given the public context of a grading request and
the action (for AutoResearch, a Python script; for LIBERO, a trajectory record) it returns
an :class:`~wmrl_envs.outcome.Outcome` with ``source="wm"`` and ``cost`` = seconds spent, or
``None`` when it cannot say. Calls are batched: one call for many (context, action) pairs,
so GPU / vectorised models amortise. What a score *means* (AutoResearch's reward ladder, its
exact compile gate) lives with the env family (:mod:`wmrl_envs.autoresearch.grading`).

Classes: :class:`WorldModel`. Functions: :func:`check_batch`, :func:`predict_requests`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from wmrl_envs.outcome import Outcome
from wmrl_envs.seam import GradingRequest

__all__ = ["WorldModel", "check_batch", "predict_requests"]


@runtime_checkable
class WorldModel(Protocol):
    """Anything that predicts outcomes in batches.

    ``predict(contexts, actions)`` takes equally long sequences of
    ``GradingRequest.context`` mappings and actions and returns one ``Outcome`` (with
    ``source="wm"``) or ``None`` (cannot say) per pair, in order.
    """

    def predict(self, contexts: Sequence[Mapping[str, Any]], actions: Sequence[Any]) -> list[Outcome | None]: ...


def check_batch(contexts: Sequence[Mapping[str, Any]], actions: Sequence[Any], *, action_type: type = str) -> None:
    """Raise a clear error unless ``contexts`` and ``actions`` form a valid batch
    (``actions`` of ``action_type``: Python scripts by default).

    >>> check_batch([{"task_id": "t"}], "print(1)")
    Traceback (most recent call last):
    ...
    TypeError: predict takes sequences (a batch): wrap a single context/action in a list
    """
    if isinstance(contexts, Mapping) or isinstance(actions, (str, bytes)):
        raise TypeError("predict takes sequences (a batch): wrap a single context/action in a list")
    if len(contexts) != len(actions):
        raise ValueError(f"predict got {len(contexts)} contexts but {len(actions)} actions")
    for i, (c, a) in enumerate(zip(contexts, actions)):
        if not isinstance(c, Mapping):
            raise TypeError(f"contexts[{i}] must be a mapping (GradingRequest.context), got {type(c).__name__}")
        if not isinstance(a, action_type):
            what = "Python script (str)" if action_type is str else action_type.__name__
            raise TypeError(f"actions[{i}] must be a {what}, got {type(a).__name__}")


def predict_requests(model: WorldModel, requests: Sequence[GradingRequest]) -> list[Outcome | None]:
    """``model.predict`` on a batch of :class:`GradingRequest` objects."""
    return model.predict([r.context for r in requests], [r.action for r in requests])
