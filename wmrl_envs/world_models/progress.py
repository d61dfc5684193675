"""Progress world models for embodied tasks, and their use as outcome world models.

A *progress world model* reads an episode -- its frames (images, or low-dimensional
states) and the language instruction -- and predicts per-frame task progress in [0, 1] and
the probability that the episode succeeded (Robometer is one; :mod:`.progress_learned`
trains one on CPU). :class:`ProgressOutcomeModel` turns it into a ``WorldModel``
(``predict(contexts, actions) -> list[Outcome | None]``) whose score is one of the paper's
dense rewards:

* ``potential``: mean of the last ``k`` progress predictions minus mean of the first ``k``
  (k = 3), clipped to [0, 1] (negative progress scores 0; the raw value is in ``metrics``);
* ``final``: the last prediction; ``max``: the largest; ``success``: the success probability.

Classes: :class:`ProgressPrediction`, :class:`ProgressWorldModel`,
:class:`ProgressOutcomeModel`. Functions: :func:`dense_score`. Constants:
:data:`DENSE_MODES`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, cast, runtime_checkable

import numpy as np

from wmrl_envs.outcome import Outcome

__all__ = ["ProgressPrediction", "ProgressWorldModel", "ProgressOutcomeModel", "dense_score", "DENSE_MODES"]

DENSE_MODES = ("potential", "final", "max", "success")


@dataclass(frozen=True)
class ProgressPrediction:
    """A progress model's reading of one episode.

    Attributes:
        progress: ``(T,)`` float per-frame progress in [0, 1].
        success_probability: probability in [0, 1] that the episode ends in success.
    """

    progress: np.ndarray
    success_probability: float

    def __post_init__(self) -> None:
        p = np.asarray(self.progress, dtype=np.float64)
        if p.ndim != 1 or len(p) == 0 or not np.all((p >= 0.0) & (p <= 1.0)):
            raise ValueError(f"progress must be a non-empty 1-D array in [0, 1], got shape {p.shape}")
        if not 0.0 <= float(self.success_probability) <= 1.0:
            raise ValueError(f"success_probability must be in [0, 1], got {self.success_probability!r}")
        object.__setattr__(self, "progress", p)
        object.__setattr__(self, "success_probability", float(self.success_probability))


@runtime_checkable
class ProgressWorldModel(Protocol):
    """(frames, instruction) -> per-frame progress and success probability, batched.

    ``input_kind`` names what a frame is: ``"frames"`` (``(T, H, W, 3)`` uint8 images) or
    ``"states"`` (``(T, D)`` float vectors). ``predict_progress`` takes equally long
    sequences of episodes and instructions and returns one prediction per episode.
    """

    input_kind: str

    def predict_progress(
        self, episodes: Sequence[np.ndarray], instructions: Sequence[str]
    ) -> list[ProgressPrediction | None]: ...


def dense_score(prediction: ProgressPrediction, mode: str = "potential", k: int = 3) -> tuple[float, float]:
    """The dense reward of ``prediction`` as ``(score in [0, 1], raw value)``.

    >>> p = ProgressPrediction(np.array([0.1, 0.1, 0.1, 0.5, 0.8, 0.9, 0.9]), 0.7)
    >>> [round(dense_score(p, m)[0], 3) for m in DENSE_MODES]
    [0.767, 0.9, 0.9, 0.7]
    """
    if mode not in DENSE_MODES:
        raise ValueError(f"dense reward mode must be one of {DENSE_MODES}, got {mode!r}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    p = prediction.progress
    if mode == "potential":
        raw = float(p[-k:].mean() - p[:k].mean())
    elif mode == "final":
        raw = float(p[-1])
    elif mode == "max":
        raw = float(p.max())
    else:
        raw = prediction.success_probability
    return float(np.clip(raw, 0.0, 1.0)), raw


class ProgressOutcomeModel:
    """A :class:`ProgressWorldModel` as a ``WorldModel`` for embodied envs.

    Each action is an episode record with the attributes ``instruction`` and the model's
    ``input_kind`` (``frames`` or ``states``), such as
    :class:`wmrl_envs.libero.env.LiberoTrajectory`. The outcome's ``score`` is the dense
    reward of ``mode``; its ``status`` is ``"success"`` when the success probability is at
    least ``success_threshold``; ``metrics`` carry ``success_probability``, ``raw_score``,
    ``final_progress``; ``cost`` is this episode's share of the batch's wall time.

    Args:
        model: the progress model.
        mode: dense reward, one of :data:`DENSE_MODES`. Default ``"potential"`` (the paper's).
        k: window of the potential mode. Default 3.
        success_threshold: success-probability threshold for ``status``. Default 0.5.

    A toy progress model that reads progress off the first state coordinate:

    >>> from types import SimpleNamespace
    >>> class FirstCoordinate:
    ...     input_kind = "states"
    ...     def predict_progress(self, episodes, instructions):
    ...         return [ProgressPrediction(np.clip(e[:, 0], 0, 1), float(e[-1, 0] > 0.9)) for e in episodes]
    >>> wm = ProgressOutcomeModel(FirstCoordinate(), mode="potential")
    >>> states = np.linspace(0.0, 1.0, 10)[:, None] * np.ones((1, 3))  # (T, D) = (10, 3)
    >>> episode = SimpleNamespace(instruction="open the drawer", states=states)
    >>> [(o.status, round(o.score, 3), o.source) for o in wm.predict([{}], [episode])]
    [('success', 0.778, 'wm')]
    """

    def __init__(
        self,
        model: ProgressWorldModel,
        mode: Literal["potential", "final", "max", "success"] = "potential",
        k: int = 3,
        success_threshold: float = 0.5,
    ):
        if mode not in DENSE_MODES:
            raise ValueError(f"mode must be one of {DENSE_MODES}, got {mode!r}")
        if getattr(model, "input_kind", None) not in ("frames", "states"):
            raise TypeError(f"model must be a ProgressWorldModel with input_kind 'frames' or 'states', got {model!r}")
        self.model, self.mode, self.k, self.success_threshold = model, mode, int(k), float(success_threshold)

    def _episode(self, i: int, action: Any) -> np.ndarray:
        episode = getattr(action, self.model.input_kind, None)
        if episode is None:
            raise ValueError(
                f"actions[{i}] has no {self.model.input_kind!r} for this {type(self.model).__name__}; "
                + ("enable cameras and record_frames in the env" if self.model.input_kind == "frames" else "")
            )
        return np.asarray(episode)

    def predict(self, contexts: Sequence[Mapping[str, Any]], actions: Sequence[Any]) -> list[Outcome | None]:
        if isinstance(contexts, Mapping):
            raise TypeError("predict takes sequences (a batch): wrap a single context/action in a list")
        if len(contexts) != len(actions):
            raise ValueError(f"predict got {len(contexts)} contexts but {len(actions)} actions")
        if not actions:
            return []
        start = time.perf_counter()
        episodes = [self._episode(i, a) for i, a in enumerate(actions)]
        instructions = [getattr(a, "instruction", None) or c.get("instruction") for c, a in zip(contexts, actions)]
        for i, text in enumerate(instructions):
            if not isinstance(text, str):
                raise ValueError(
                    f"episode {i} has no instruction (neither action.instruction nor context['instruction'])"
                )
        predictions = self.model.predict_progress(episodes, cast(list[str], instructions))  # all str: checked above
        cost = (time.perf_counter() - start) / len(actions)
        outcomes: list[Outcome | None] = []
        for pred in predictions:
            if pred is None:
                outcomes.append(None)
                continue
            score, raw = dense_score(pred, self.mode, self.k)
            success = pred.success_probability >= self.success_threshold
            outcomes.append(
                Outcome(
                    "success" if success else "failure",
                    score,
                    feedback=f"predicted progress {pred.progress[-1]:.2f}, success probability {pred.success_probability:.2f}",
                    metrics={
                        "success_probability": pred.success_probability,
                        "raw_score": raw,
                        "final_progress": float(pred.progress[-1]),
                        "mode": self.mode,
                    },
                    cost=cost,
                    source="wm",
                )
            )
        return outcomes
