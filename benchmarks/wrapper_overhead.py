"""What the wrapper stack costs, and what the world model saves (issue 4 benchmark).

Prints, in one run:

1. **Isotonic refit** — :meth:`wrappers.OnlineDebiaser.refit` on 5,000 anchor pairs (the FIFO
   cap), median over repeats, and the time to map a batch of scores.
2. **Per-step overhead of the wrapper stack** — the same episodes on the same env, fed
   the same outcomes: the bare env (outcome handed over through ``pending_outcome``) vs
   ``CalibrationWrapper(AnchorWrapper(WorldModelWrapper(env)))`` whose world model looks
   the outcomes up (so grading costs ~0 and only the wrappers' own work differs). Single
   env and ``SyncVectorEnv``; medians per episode step over repeated blocks.
3. **World model vs sandbox throughput** on the same solutions (an AutoResearch task's
   solution pool): real grading in the sandbox vs ``CodeOutcomeModel`` predictions, and
   the ratio (the shipped default model, else one fitted on this run's sandbox outcomes).

Run: ``python -m benchmarks.wrapper_overhead [--task titanic] [--repeats 7]``.

Functions: :func:`main`, :func:`refit_times`, :func:`stack_overhead`, :func:`wm_vs_sandbox`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from tqdm import tqdm

from wmrl_envs.outcome import Outcome
from wmrl_envs.seam import GradingRequest, OutcomeSeam
from wrappers import (
    AnchorWrapper,
    CalibrationWrapper,
    OnlineDebiaser,
    VectorAnchorWrapper,
    VectorCalibrationWrapper,
    VectorWorldModelWrapper,
    WorldModelWrapper,
)

__all__ = ["main", "refit_times", "stack_overhead", "wm_vs_sandbox"]


def _median_seconds(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def refit_times(n_pairs: int = 5000, repeats: int = 7, batch: int = 256) -> dict[str, float]:
    """Median seconds of one isotonic refit on ``n_pairs`` pairs and of mapping ``batch`` scores."""
    rng = np.random.default_rng(0)
    r = rng.random(n_pairs)
    wm = np.clip(0.25 + 0.55 * r + 0.2 * r**2 + rng.normal(0, 0.05, n_pairs), 0, 1)
    d = OnlineDebiaser(start_pairs=n_pairs, max_pairs=n_pairs)
    d.add(list(zip(wm.tolist(), r.tolist())))
    scores = rng.random(batch).tolist()
    return {
        "refit_s": _median_seconds(d.refit, repeats),
        "transform_s": _median_seconds(lambda: d.transform(scores), repeats),
        "pairs": n_pairs,
        "batch": batch,
    }


class _LookupEnv(OutcomeSeam, gym.Env):
    """A one-turn seam env whose real grading is a table lookup: it isolates the wrappers'
    own cost (the quantity measured), not a stand-in for any real task."""

    def __init__(self, table: Mapping[tuple[int, int], Outcome]) -> None:
        self.table = table
        self.action_space = gym.spaces.Discrete(max(a for _, a in table) + 1)
        self.observation_space = gym.spaces.Discrete(2)
        self.task, self.turn = 0, 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.task, self.turn = int((options or {}).get("task", 0)), 0
        return 0, {"task_id": self.task}

    def grading_request(self, action: Any) -> GradingRequest | None:
        return None if action is None or self.turn else GradingRequest({"task_id": self.task}, int(action))

    def grade(self, request: GradingRequest) -> Outcome | None:
        return self.table[(request.context["task_id"], request.action)]

    def apply(self, action: Any, outcome: Outcome | None):
        self.turn = 1
        score = None if outcome is None else outcome.score
        return 1, float(score or 0.0), True, False, {"task_id": self.task, "outcome": outcome, "graded": True}


class _LookupWorldModel:
    """Predicts by looking the (biased) outcome up: grading cost ~0, so timings show wrapper cost."""

    def __init__(self, table: Mapping[tuple[int, int], Outcome]) -> None:
        self.table = {k: o.with_score(self._biased(o.score)) for k, o in table.items()}

    @staticmethod
    def _biased(score: float | None) -> float:
        assert score is not None  # the lookup table holds scored outcomes only
        return min(1.0, 0.25 + 0.55 * score + 0.2 * score**2)

    def predict(self, contexts: Sequence[Mapping[str, Any]], actions: Sequence[Any]) -> list[Outcome | None]:
        return [self.table[(c["task_id"], int(a))] for c, a in zip(contexts, actions)]


def stack_overhead(episodes: int = 512, repeats: int = 7, num_envs: int = 8) -> dict[str, float]:
    """Median microseconds per episode step: bare env vs the full stack (single and vector)."""
    rng = np.random.default_rng(1)
    tasks, n_actions, group = 64, 16, 8
    table = {
        (t, a): Outcome("valid", float(rng.random()), source="env") for t in range(tasks) for a in range(n_actions)
    }
    wm = _LookupWorldModel(table)
    plan = [(int(rng.integers(tasks)), int(rng.integers(n_actions))) for _ in range(episodes)]

    def bare_block(env: _LookupEnv) -> None:
        for task, action in plan:
            env.reset(options={"task": task})
            env.pending_outcome = wm.table[(task, action)]  # the same outcome the stack's model gives
            env.step(action)

    def stack_block(env: gym.Env) -> None:
        for k, (task, action) in enumerate(plan):
            env.reset(options={"task": task, "group_id": f"g{k // group}", "group_size": group})
            env.step(action)

    def make_stack() -> gym.Env:
        return CalibrationWrapper(
            AnchorWrapper(WorldModelWrapper(_LookupEnv(table), wm), fraction=0.1, seed=0), start_pairs=64
        )

    def vector_block(venv: gym.vector.VectorEnv, grouped: bool) -> None:
        for k in range(0, episodes, num_envs):
            opts = {"task": plan[k][0], "group_id": f"v{k}"} if grouped else {"task": plan[k][0]}
            venv.reset(options=opts)
            venv.step(np.array([a for _, a in plan[k : k + num_envs]]))

    def make_vector(stacked: bool) -> gym.vector.VectorEnv:
        venv = gym.vector.SyncVectorEnv([lambda: _LookupEnv(table)] * num_envs)
        if not stacked:
            return venv
        return VectorCalibrationWrapper(
            VectorAnchorWrapper(VectorWorldModelWrapper(venv, wm), fraction=0.1, seed=0), start_pairs=64
        )

    bare, stack = _LookupEnv(table), make_stack()
    stack_block(stack)  # warm-up: the map gets fitted, so refits are part of the steady state
    vbare, vstack = make_vector(False), make_vector(True)
    vbare.reset(options={"task": 0})
    vstack.reset(options={"task": 0})
    out = {
        "bare_us": _median_seconds(lambda: bare_block(bare), repeats) / episodes * 1e6,
        "stack_us": _median_seconds(lambda: stack_block(stack), repeats) / episodes * 1e6,
        "vector_bare_us": _median_seconds(lambda: vector_block(vbare, False), repeats) / episodes * 1e6,
        "vector_stack_us": _median_seconds(lambda: vector_block(vstack, True), repeats) / episodes * 1e6,
        "episodes": episodes,
        "num_envs": num_envs,
    }
    vbare.close()
    vstack.close()
    return out


def wm_vs_sandbox(task: str, repeats: int = 3) -> dict[str, Any]:
    """Solutions per second: real grading (sandbox) vs ``CodeOutcomeModel`` on ``task``'s pool.

    The world model is the shipped default when there is one; otherwise it is fitted on
    this run's own sandbox outcomes (throughput does not depend on the fit's quality).
    Returns ``{"skipped": reason}`` when the AutoResearch env is not available here.
    """
    try:
        from wmrl_envs.autoresearch.env import AutoResearchEnv
        from wmrl_envs.autoresearch.leaderboard import reference_pool
        from wmrl_envs.world_models import CodeOutcomeModel, LogRecord

        env = AutoResearchEnv(task, max_turns=1)
        pool = reference_pool(task, size="small", broken=False)
    except (ImportError, KeyError, ValueError) as err:
        return {"skipped": f"{type(err).__name__}: {err}"}
    requests = []
    for sol in pool:
        env.reset(options={"task": task})
        request = env.grading_request(f"```python\n{sol.code}\n```")
        if request is not None:
            requests.append(request)
    t0 = time.perf_counter()
    real = [env.grade(r) for r in tqdm(requests, desc=f"sandbox runs ({task})", leave=False)]
    sandbox_s = time.perf_counter() - t0
    env.close()
    try:
        model, model_origin = CodeOutcomeModel.load_default(), "shipped default"
    except FileNotFoundError:
        records = [LogRecord(task, r.action, r.context, o) for r, o in zip(requests, real) if o is not None]
        model, model_origin = CodeOutcomeModel().fit(records), f"fitted on these {len(records)} runs"
    contexts, actions = [r.context for r in requests], [r.action for r in requests]
    wm_s = _median_seconds(lambda: model.predict(contexts, actions), repeats)
    return {
        "task": task,
        "solutions": len(requests),
        "model": model_origin,
        "sandbox_per_s": len(requests) / sandbox_s,
        "wm_per_s": len(requests) / wm_s,
        "ratio": sandbox_s / wm_s,
        "real_unknown": sum(o is None for o in real),
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5000, help="anchor pairs for the refit timing (default 5000)")
    parser.add_argument("--episodes", type=int, default=512, help="episodes per overhead block (default 512)")
    parser.add_argument("--repeats", type=int, default=7, help="repeats; medians are reported (default 7)")
    parser.add_argument("--task", default="titanic", help="AutoResearch task for WM vs sandbox (default titanic)")
    parser.add_argument("--no-sandbox", action="store_true", help="skip the WM vs sandbox section")
    args = parser.parse_args(argv)

    refit = refit_times(args.pairs, args.repeats)
    print(
        f"isotonic refit on {refit['pairs']} pairs: {refit['refit_s'] * 1e3:.2f} ms (median of {args.repeats}); "
        f"mapping {refit['batch']} scores: {refit['transform_s'] * 1e6:.0f} us"
    )

    over = stack_overhead(args.episodes, args.repeats)
    print(f"\nper episode step (one-turn episodes incl. reset; median of {args.repeats} blocks of {over['episodes']}):")
    print(f"  {'':18}{'bare env':>12}{'full stack':>12}{'overhead':>12}{'ratio':>8}")
    for name, b, s in (
        ("single env", over["bare_us"], over["stack_us"]),
        (f"Sync x{over['num_envs']}", over["vector_bare_us"], over["vector_stack_us"]),
    ):
        print(f"  {name:18}{b:>10.1f}us{s:>10.1f}us{s - b:>10.1f}us{s / b:>8.2f}")

    result: dict[str, Any] = {"refit": refit, "overhead": over}
    if not args.no_sandbox:
        speed = wm_vs_sandbox(args.task, args.repeats)
        result["wm_vs_sandbox"] = speed
        if "skipped" in speed:
            print(f"\nWM vs sandbox: skipped ({speed['skipped']})")
        else:
            print(
                f"\nWM vs sandbox on the same {speed['solutions']} solutions of {speed['task']} "
                f"(sequential sandbox runs; CodeOutcomeModel {speed['model']}, one batched call):"
            )
            print(f"  {'sandbox':>12}{'world model':>14}{'ratio':>10}")
            print(f"  {speed['sandbox_per_s']:>10.2f}/s{speed['wm_per_s']:>12.1f}/s{speed['ratio']:>9.0f}x")
    return result


if __name__ == "__main__":
    main()
