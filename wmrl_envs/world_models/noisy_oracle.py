"""NoisyOracle — a *research instrument*, not a world model anyone should train with by default.

It wraps a **true** grader (a callable ``GradingRequest -> Outcome | None``: an env's real
``grade``, or :class:`LoggedOutcomes`, a lookup of logged true outcomes) and corrupts its
score with a known bias function and zero-mean Gaussian noise::

    score = clip(bias_fn(true_score) + N(0, sigma^2), 0, 1)

so experiments can dial the world-model bias B and noise sigma of the paper's analysis
and check what Online Debiasing and Inverse-Variance Denoising recover. Status and
feedback are the true ones; ``source`` is ``"wm"``; ``cost`` is the measured time of the
call (which includes the true grader's time — for cost studies use a lookup grader or
account for it). Noise is drawn from a seeded generator in call order.

Classes: :class:`NoisyOracle`, :class:`LoggedOutcomes`. Constant: :data:`BIAS_PRESETS`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from wmrl_envs.outcome import Outcome
from wmrl_envs.seam import GradingRequest
from wmrl_envs.world_models.logs import LogRecord

__all__ = ["NoisyOracle", "LoggedOutcomes", "BIAS_PRESETS", "quadratic_bias"]


def quadratic_bias(r: np.ndarray | float) -> np.ndarray | float:
    """The synthetic bias of issue 4: ``0.25 + 0.55 r + 0.2 r^2`` (monotone, compressive)."""
    return 0.25 + 0.55 * r + 0.2 * r**2


#: Named bias functions (score -> biased score, before noise and clipping).
BIAS_PRESETS: Mapping[str, Callable[[Any], Any]] = {
    "identity": lambda r: r,
    "quadratic": quadratic_bias,
}


class LoggedOutcomes:
    """A true grader that looks outcomes up in execution logs by (task id, script).

    Returns ``None`` for a request it has never seen (unknown, not 0). The task id is read
    from ``request.context["task_id"]``.
    """

    def __init__(self, records: Sequence[LogRecord]) -> None:
        self._table = {(r.task_id, r.code): r.outcome for r in records}

    def __len__(self) -> int:
        return len(self._table)

    def __call__(self, request: GradingRequest) -> Outcome | None:
        return self._table.get((str(request.context.get("task_id")), request.action))


class NoisyOracle:
    """True outcomes with a controlled bias and noise (research instrument; see module doc).

    Args:
        grader: the true grader, ``GradingRequest -> Outcome | None``.
        bias: a name from :data:`BIAS_PRESETS` or a function applied to the true score.
        sigma: standard deviation of the added Gaussian noise (default 0.0).
        seed: seed of the noise generator (default 0).

    >>> truth = lambda req: Outcome("valid", 0.5)
    >>> o = NoisyOracle(truth, bias="quadratic", sigma=0.0).predict([{}], ["print(1)"])[0]
    >>> o.source, round(o.score, 4)
    ('wm', 0.575)
    """

    def __init__(
        self,
        grader: Callable[[GradingRequest], Outcome | None],
        bias: str | Callable[[Any], Any] = "identity",
        sigma: float = 0.0,
        seed: int = 0,
    ) -> None:
        if not callable(grader):
            raise TypeError(f"grader must be callable (GradingRequest -> Outcome | None), got {type(grader).__name__}")
        if isinstance(bias, str):
            if bias not in BIAS_PRESETS:
                raise ValueError(f"unknown bias preset {bias!r}; known: {', '.join(BIAS_PRESETS)}")
            bias = BIAS_PRESETS[bias]
        if not callable(bias):
            raise TypeError(f"bias must be a preset name or a callable, got {type(bias).__name__}")
        if not sigma >= 0.0:
            raise ValueError(f"sigma must be >= 0, got {sigma}")
        self.grader, self.bias_fn, self.sigma, self.seed = grader, bias, float(sigma), seed
        self._rng = np.random.default_rng(seed)

    def reseed(self, seed: int | None = None) -> None:
        """Restart the noise stream (from ``seed``, default the constructor's)."""
        self._rng = np.random.default_rng(self.seed if seed is None else seed)

    def predict(self, contexts: Sequence[Mapping[str, Any]], actions: Sequence[Any]) -> list[Outcome | None]:
        if len(contexts) != len(actions):
            raise ValueError(f"predict got {len(contexts)} contexts but {len(actions)} actions")
        out: list[Outcome | None] = []
        for ctx, action in zip(contexts, actions):
            start = time.perf_counter()
            true = self.grader(GradingRequest(context=ctx, action=action))
            if true is None or true.score is None:
                out.append(None)
                continue
            noisy = float(self.bias_fn(true.score)) + (self._rng.normal(0.0, self.sigma) if self.sigma > 0 else 0.0)
            score = min(1.0, max(0.0, noisy))
            # metrics are dropped: they hold the unbiased truth (raw metric, percentile).
            out.append(Outcome(true.status, score, true.feedback, {}, time.perf_counter() - start, "wm"))
        return out
