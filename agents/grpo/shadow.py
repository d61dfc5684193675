"""Exploitation, measured: grade a sample of what the policy writes for real, outside training.

A policy trained on world-model rewards can learn what the world model overrates. The anchor
monitor sees that only on anchor groups, and only for the arm that has them. A
:class:`ShadowProbe` (a callback of :func:`agents.grpo.train`) sees it for any arm graded by a
world model (``wm`` and ``wmrl``): it remembers the world-model-only gradings of the step just
run (the current policy's own scripts, with the raw and calibrated world-model outcomes the
policy was rewarded with), and every ``every`` steps grades a seeded sample of ``sample`` of
them for real, with its own grader (so nothing it runs lands in the arm's outcome cache). Per
probe it records the raw and calibrated gap (world-model score minus real score, unknown real
outcomes excluded and counted), and the CPU and wall seconds it took (``cpu_s``, ``wall_s``:
a budgeted run subtracts them, as it does its evaluations).

A raw gap that grows over training is the policy exploiting the world model; a calibrated gap
that stays near 0 is the corrections holding.

Example::

    probe = ShadowProbe(env, every=20, sample=4)
    train(agent, callbacks=[probe])
    probe.records[-1]["raw_gap"], probe.summary()["raw_gap_slope_per_step"]

Classes: :class:`ShadowProbe`. Functions: :func:`summarize_probes`.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from wmrl_envs.outcome import Outcome
from wrappers import StackHandle

__all__ = ["ShadowProbe", "summarize_probes"]


def _cpu() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _score(outcome: Outcome | None) -> float | None:
    return None if outcome is None else outcome.score


class ShadowProbe:
    """Grade a sample of the policy's world-model-graded scripts for real (module docstring).

    Args:
        env: the training stack (any stack with a world-model layer).
        every: steps between probes.
        sample: scripts graded for real per probe (fewer when the step had fewer).
        seed: seed of the sampling.
        grader: ``request -> Outcome | None`` grading for real outside the training env
            (default: the env's own ``grade``, see :meth:`~wrappers.StackHandle.real_grader`;
            pass one with its own executor when the env's caches outcomes for the arm).
    """

    def __init__(
        self,
        env: Any,
        *,
        every: int = 20,
        sample: int = 4,
        seed: int = 0,
        grader: Callable[[Any], Outcome | None] | None = None,
    ) -> None:
        if every < 1 or sample < 1:
            raise ValueError(f"every and sample must be >= 1, got {every}, {sample}")
        handle = StackHandle(env)
        self.grader = grader or handle.real_grader()
        if not callable(self.grader):
            raise TypeError("ShadowProbe needs grader=: this env exposes no grade(request) to run scripts for real")
        self.every, self.sample, self.seed = every, sample, seed
        self.records: list[dict[str, Any]] = []
        self.cpu_s = self.wall_s = 0.0
        self._step: list[tuple[Any, float | None, float | None]] = []
        handle.on_wm_graded(self._on_wm)

    def _on_wm(self, request: Any, raw: Outcome | None, calibrated: Outcome | None) -> None:
        self._step.append((request, _score(raw), _score(calibrated)))

    def __call__(self, step: int, metrics: Mapping[str, Any]) -> bool:
        """Step boundary: probe every ``every`` steps; forget the step's gradings. Never stops training."""
        seen, self._step = self._step, []
        if step % self.every or not seen:
            return False
        rng = np.random.default_rng([self.seed, step])
        picks = rng.choice(len(seen), size=min(self.sample, len(seen)), replace=False)
        cpu0, wall0 = _cpu(), time.perf_counter()
        rows = [(seen[i][1], seen[i][2], _score(self.grader(seen[i][0]))) for i in sorted(picks.tolist())]
        cpu, wall = _cpu() - cpu0, time.perf_counter() - wall0
        self.cpu_s += cpu
        self.wall_s += wall
        known = [(w, c, t) for w, c, t in rows if t is not None]
        raw = [w - t for w, _, t in known if w is not None]
        cal = [c - t for _, c, t in known if c is not None]
        self.records.append(
            {
                "step": step,
                "n": len(rows),
                "unknown_real": len(rows) - len(known),
                "raw_gap": float(np.mean(raw)) if raw else None,
                "calibrated_gap": float(np.mean(cal)) if cal else None,
                "real_mean": float(np.mean([t for *_, t in known])) if known else None,
                "cpu_s": cpu,
                "wall_s": wall,
            }
        )
        return False

    def summary(self) -> dict[str, Any]:
        """:func:`summarize_probes` of the probes so far."""
        return summarize_probes(self.records, cpu_s=self.cpu_s, wall_s=self.wall_s)

    def state_dict(self) -> dict[str, Any]:
        """JSON-ready: the probes so far and their cost."""
        return {"records": list(self.records), "cpu_s": self.cpu_s, "wall_s": self.wall_s}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.records = list(state["records"])
        self.cpu_s, self.wall_s = float(state["cpu_s"]), float(state["wall_s"])


def summarize_probes(
    records: Sequence[Mapping[str, Any]], *, cpu_s: float = 0.0, wall_s: float = 0.0
) -> dict[str, Any]:
    """Per gap (raw and calibrated) over a probe's ``records``: its mean over the first and
    the last quarter of the probes (``_start``, ``_end``; at least one probe each) with their
    standard errors over those probes (``_start_se``, ``_end_se``; ``None`` from a single
    probe), the mean over every probe (``_mean``, ``_mean_se``) and the least-squares slope
    per step; plus the number of real gradings and what they cost (``cpu_s``, ``wall_s``).
    One probe grades a few scripts, so a single probe's gap moves by ~0.1 between
    neighbours: the ends are quarters, not points. Works on saved records as well.
    """
    out: dict[str, Any] = {
        "probes": len(records),
        "executions": sum(r["n"] for r in records),
        "unknown_real": sum(r["unknown_real"] for r in records),
        "cpu_s": cpu_s,
        "wall_s": wall_s,
    }
    for key in ("raw_gap", "calibrated_gap"):
        points = [(r["step"], r[key]) for r in records if r[key] is not None]
        steps, gaps = np.array([s for s, _ in points], float), np.array([g for _, g in points], float)
        quarter = max(1, len(gaps) // 4)
        for name, part in (("start", gaps[:quarter]), ("end", gaps[-quarter:]), ("mean", gaps)):
            out[f"{key}_{name}"] = float(part.mean()) if len(part) else None
            out[f"{key}_{name}_se"] = float(part.std(ddof=1) / np.sqrt(len(part))) if len(part) >= 2 else None
        slope = float(np.polyfit(steps, gaps, 1)[0]) if len(set(steps.tolist())) >= 2 else None
        out[f"{key}_slope_per_step"] = slope
    return out
