"""The world-model protocol and what every world model shares.

A world model grades by prediction: given the public context of a grading request and
the action (for AutoResearch, a Python script) it returns an :class:`Outcome` with
``source="wm"`` and ``cost`` = seconds spent, or ``None`` when it cannot say. Calls are
batched: one call for many (context, action) pairs, so GPU / vectorised models amortise.

Classes: :class:`WorldModel`. Functions: :func:`check_batch`, :func:`predict_requests`,
:func:`ladder_score`, :func:`compile_gate`. Constants: :data:`LADDER`.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

from wmrl_envs.outcome import Outcome
from wmrl_envs.seam import GradingRequest

__all__ = ["WorldModel", "LADDER", "ladder_score", "compile_gate", "check_batch", "predict_requests"]

#: The AutoResearch reward ladder (DESIGN.md) for statuses without a percentile.
#: A ``valid`` outcome scores ``0.5 + 0.5 * percentile``.
LADDER: Mapping[str, float] = {
    "malformed": 0.0,
    "syntax_error": 0.0,
    "runtime_error": 0.1,
    "timeout": 0.1,
    "no_submission": 0.2,
}


@runtime_checkable
class WorldModel(Protocol):
    """Anything that predicts outcomes in batches.

    ``predict(contexts, actions)`` takes equally long sequences of
    ``GradingRequest.context`` mappings and actions and returns one ``Outcome`` (with
    ``source="wm"``) or ``None`` (cannot say) per pair, in order.
    """

    def predict(self, contexts: Sequence[Mapping[str, Any]], actions: Sequence[Any]) -> list[Outcome | None]:
        ...


def ladder_score(status: str, percentile: float | None = None) -> float | None:
    """Reward-scale score of ``status``; ``valid`` needs ``percentile`` (else ``None``).

    >>> ladder_score("runtime_error"), ladder_score("valid", 0.5)
    (0.1, 0.75)
    """
    if status == "valid":
        if percentile is None:
            return None
        return 0.5 + 0.5 * min(1.0, max(0.0, float(percentile)))
    if status not in LADDER:
        raise ValueError(f"no ladder score for status {status!r}; known: valid, {', '.join(LADDER)}")
    return LADDER[status]


def compile_gate(code: str) -> Outcome | None:
    """The exact outcome of a script that does not compile, else ``None``.

    Compilation is deterministic, so no world model needs to guess here: a script that
    ``compile`` rejects fails in the sandbox with a ``SyntaxError`` before running.

    >>> compile_gate("print(1").status, compile_gate("print(1)") is None
    ('syntax_error', True)
    """
    try:
        compile(code, "main.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as e:  # ValueError: NUL bytes in the source
        where = f" (line {e.lineno})" if getattr(e, "lineno", None) else ""
        return Outcome(
            "syntax_error",
            0.0,
            feedback=f"{type(e).__name__}: {getattr(e, 'msg', str(e))}{where}",
            metrics={"compile_gate": True},
            source="wm",
        )
    return None


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
