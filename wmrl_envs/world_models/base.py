"""The world-model protocol and what every world model shares.

A world model grades by prediction: given the public context of a grading request and
the action (for AutoResearch, a Python script) it returns an :class:`Outcome` with
``source="wm"`` and ``cost`` = seconds spent, or ``None`` when it cannot say. Calls are
batched: one call for many (context, action) pairs, so GPU / vectorised models amortise.

Classes: :class:`WorldModel`. Functions: :func:`check_batch`, :func:`predict_requests`,
:func:`compile_gate`; re-exported from the AutoResearch grader (one reward ladder for
the env and its world models): :data:`LADDER`, :func:`ladder_score`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

from wmrl_envs.autoresearch.grading import LADDER, check_syntax, ladder_score
from wmrl_envs.outcome import Outcome
from wmrl_envs.seam import GradingRequest

__all__ = ["WorldModel", "LADDER", "ladder_score", "compile_gate", "check_batch", "predict_requests"]


@runtime_checkable
class WorldModel(Protocol):
    """Anything that predicts outcomes in batches.

    ``predict(contexts, actions)`` takes equally long sequences of
    ``GradingRequest.context`` mappings and actions and returns one ``Outcome`` (with
    ``source="wm"``) or ``None`` (cannot say) per pair, in order.
    """

    def predict(self, contexts: Sequence[Mapping[str, Any]], actions: Sequence[Any]) -> list[Outcome | None]:
        ...


def compile_gate(code: str) -> Outcome | None:
    """The exact outcome of a script that does not compile, else ``None``.

    Compilation is deterministic, so no world model needs to guess here: a script that
    ``compile`` rejects fails in the sandbox with a ``SyntaxError`` before running. The
    outcome is the env's own (:func:`wmrl_envs.autoresearch.grading.check_syntax`), marked
    ``source="wm"`` and ``metrics["compile_gate"] = True``.

    >>> compile_gate("print(1").status, compile_gate("print(1)") is None
    ('syntax_error', True)
    """
    exact = check_syntax(code)
    if exact is None:
        return None
    return dataclasses.replace(exact, metrics={**exact.metrics, "compile_gate": True}, source="wm")


def check_batch(contexts: Sequence[Mapping[str, Any]], actions: Sequence[Any]) -> None:
    """Raise a clear error unless ``contexts`` and ``actions`` form a valid batch of scripts."""
    if isinstance(contexts, Mapping) or isinstance(actions, (str, bytes)):
        raise TypeError("predict takes sequences (a batch): wrap a single context/action in a list")
    if len(contexts) != len(actions):
        raise ValueError(f"predict got {len(contexts)} contexts but {len(actions)} actions")
    for i, (c, a) in enumerate(zip(contexts, actions)):
        if not isinstance(c, Mapping):
            raise TypeError(f"contexts[{i}] must be a mapping (GradingRequest.context), got {type(c).__name__}")
        if not isinstance(a, str):
            raise TypeError(f"actions[{i}] must be a Python script (str), got {type(a).__name__}")


def predict_requests(model: WorldModel, requests: Sequence[GradingRequest]) -> list[Outcome | None]:
    """``model.predict`` on a batch of :class:`GradingRequest` objects."""
    return model.predict([r.context for r in requests], [r.action for r in requests])
