"""Scale-out throughput: sandbox runs on Ray vs a local pool, LIBERO rollouts on Ray actors vs AsyncVectorEnv, and anchors that overlap the step.

Three parts (``--parts``), each on real engines:

* ``sandbox``: the same ``--solutions`` reference solutions of ``--task`` graded for real
  (:meth:`AutoResearchEnv.grade`) through a local :class:`~wmrl_envs.sandbox.LocalExecutor`
  pool of ``--local-workers`` threads, then through a
  :class:`~wmrl_envs.sandbox.RayExecutor` capped at 1, 2, 4 concurrent runs
  (``--ray-workers``); runs per second, the ratio to the local pool, and how many outcomes
  are identical to the local backend's (status and score). One warm-up batch per backend
  (Ray worker start-up) is not timed.
* ``libero``: LIBERO-Long state-only steps per second with ``--libero-envs`` sub-envs as
  ``AsyncVectorEnv`` processes vs :class:`~wmrl_envs.ray_vector.RayVectorEnv` actors, same
  task, seeds and random actions; resets are not timed.
* ``anchors``: the WMRL GRPO step (``--anchor-policy``, plan scaffold, shipped
  ``CodeOutcomeModel``, ``--anchor-groups`` groups of ``--anchor-group-size`` on a sync
  vector env of ``--anchor-slots`` sub-envs, so groups run in rounds) with anchors graded
  inside the step vs in the background (``AnchorWrapper(overlap=True)``), same seeds and
  fresh policy weights for both; per step: wall, the anchors' real grading still on the
  critical path (``time/real_grading_wall``), and its share of the step.

On 2 cores the absolute numbers are small: read the ratios. On a cluster the same command
runs with ``--address auto`` (or ``RAY_ADDRESS=HEAD:6379``) after ``ray start --head`` on
the head and ``ray start --address=HEAD:6379`` on each worker node (every node with this
package installed); ``--ray-workers 8 16 32`` then measures the cluster.

Run: ``nice wmrl-bench scale`` (all parts, ~15 min on 2 busy cores) or
``wmrl-bench scale --parts sandbox``. Writes ``results.{json,md}`` and ``scale.png``.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import new_figure, save_figure
from benchmarks.report import machine_summary, markdown_table, write_results

__all__ = ["ScaleConfig", "CONFIG", "run", "sandbox_throughput", "libero_throughput", "anchor_overlap"]

PARTS = ("sandbox", "libero", "anchors")


@dataclass
class ScaleConfig:
    """Knobs of the scale-out benchmark.

    Attributes:
        parts: which parts to run: ``sandbox``, ``libero``, ``anchors``.
        address: Ray cluster to join (``auto``, ``HOST:6379``); none = a local instance.
        task: AutoResearch task whose reference solutions are graded (sandbox part).
        solutions: how many of its reference solutions (the same ones for every backend).
        local_workers: threads of the local sandbox pool.
        ray_workers: concurrent runs of the RayExecutor, one measurement each.
        rounds: times the whole sandbox sequence (local pool, then each Ray width) is
            repeated, interleaved so that load drifts hit every backend alike; the median
            runs/s per backend is reported.
        libero_envs: sub-envs of both LIBERO vector envs.
        libero_steps: timed vector steps per LIBERO vector env.
        libero_task: LIBERO-Long task index.
        anchor_policy: policy of the anchors part (``tiny-plan``, ``tiny``, ``default``).
        anchor_steps: measured GRPO steps per arm (after one warm-up step).
        anchor_groups: groups per step.
        anchor_group_size: members per group.
        anchor_slots: sub-envs of the sync vector env (groups run in rounds of slots / size).
        anchor_fraction: target share of anchor groups (the per-step floor of 1 applies).
        max_new_tokens: generation budget per reply (anchors part).
        seed: seed of every part.
    """

    parts: tuple[str, ...] = PARTS
    address: str | None = None
    task: str = "penguins"
    solutions: int = 12
    local_workers: int = 2
    ray_workers: tuple[int, ...] = (1, 2, 4)
    rounds: int = 1
    libero_envs: int = 2
    libero_steps: int = 60
    libero_task: int = 0
    anchor_policy: str = "tiny-plan"
    anchor_steps: int = 3
    anchor_groups: int = 4
    anchor_group_size: int = 4
    anchor_slots: int = 4
    anchor_fraction: float = 0.25
    max_new_tokens: int = 48
    seed: int = 0

    def __post_init__(self) -> None:
        bad = [p for p in self.parts if p not in PARTS]
        if bad or not self.parts:
            raise ValueError(f"parts must be a non-empty subset of {PARTS}, got {self.parts!r}")
        if not self.ray_workers or min(self.ray_workers) < 1:
            raise ValueError(f"ray_workers must be positive counts, got {self.ray_workers!r}")


CONFIG = ScaleConfig


# ------------------------------------------------------------------------------ sandbox
def _grade_all(env: Any, requests: list[Any], width: int) -> tuple[list[Any], float]:
    with ThreadPoolExecutor(width) as pool:
        t0 = time.perf_counter()
        outcomes = list(pool.map(env.grade, requests))
    return outcomes, time.perf_counter() - t0


def _key(outcome: Any) -> tuple[Any, Any]:
    return (None, None) if outcome is None else (outcome.status, outcome.score)


def sandbox_throughput(config: ScaleConfig) -> dict[str, Any]:
    """Rows of runs/s per backend on the same solutions (see the module docstring)."""
    from wmrl_envs.autoresearch.env import AutoResearchEnv
    from wmrl_envs.autoresearch.leaderboard import reference_pool
    from wmrl_envs.sandbox import LocalExecutor, RayExecutor

    probe = AutoResearchEnv(config.task, max_turns=1)
    probe.reset(options={"task": config.task})
    requests = [
        r
        for sol in reference_pool(config.task, size="small", broken=False)
        if (r := probe.grading_request(f"```python\n{sol.code}\n```")) is not None
    ][: config.solutions]
    warm = [probe.grading_request("```python\nprint(1)\n```")]
    backends: list[tuple[str, int, Any]] = [("local pool", config.local_workers, LocalExecutor())]
    for workers in config.ray_workers:
        executor = RayExecutor(address=config.address, local_cpus=max(config.ray_workers), max_concurrent=workers)
        _ = executor.ray  # join or start the instance here, not in a grading thread
        backends.append(("ray", workers, executor))
    envs = [AutoResearchEnv(config.task, max_turns=1, executor=ex) for _, _, ex in backends]
    for env, (_, width, _) in zip(envs, backends):
        _grade_all(env, warm * width, width)  # worker start-up and first imports, not timed
    seconds: list[list[float]] = [[] for _ in backends]
    outcomes: list[list[Any]] = [[] for _ in backends]
    for _ in range(config.rounds):
        for k, (env, (_, width, _)) in enumerate(zip(envs, backends)):
            out, dt = _grade_all(env, requests, width)
            seconds[k].append(dt)
            outcomes[k] = out
    rows: list[dict[str, Any]] = []
    base = len(requests) / statistics.median(seconds[0])
    for k, (name, width, executor) in enumerate(backends):
        rate = len(requests) / statistics.median(seconds[k])
        row = {
            "backend": name, "workers": width, "runs": len(requests), "seconds": statistics.median(seconds[k]),
            "seconds_per_round": seconds[k], "runs_per_s": rate, "vs_local": rate / base,
            "identical": sum(_key(a) == _key(b) for a, b in zip(outcomes[k], outcomes[0])),
        }  # fmt: skip
        if name == "ray":
            row["harness_retries"] = executor.stats.harness_retries
        rows.append(row)
    return {"task": config.task, "rounds": config.rounds, "rows": rows}


# ------------------------------------------------------------------------------- libero
def _libero_steps_per_s(env: Any, steps: int, seed: int) -> float:
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    low, high = env.single_action_space.low, env.single_action_space.high
    actions = rng.uniform(low, high, size=(steps, env.num_envs, len(low))).astype(np.float32)
    t0 = time.perf_counter()
    for a in actions:
        env.step(a)
    return steps * env.num_envs / (time.perf_counter() - t0)


def libero_throughput(config: ScaleConfig) -> dict[str, Any]:
    """Sub-env steps per second: AsyncVectorEnv processes vs RayVectorEnv actors."""
    import gymnasium as gym

    from wmrl_envs.ray_vector import EnvFactory, RayVectorEnv

    kwargs = dict(task_id=config.libero_task, cameras=False, max_episode_steps=config.libero_steps + 10)
    fns = [EnvFactory("wmrl/LIBERO-Long-v0", **kwargs) for _ in range(config.libero_envs)]
    rows: list[dict[str, Any]] = []
    try:
        # spawn, not fork: forking a process that runs Ray's threads can deadlock the child
        venv: Any = gym.vector.AsyncVectorEnv(fns, shared_memory=False, context="spawn")
        rows.append({"vector env": "AsyncVectorEnv", "envs": config.libero_envs,
                     "steps_per_s": _libero_steps_per_s(venv, config.libero_steps, config.seed)})  # fmt: skip
        venv.close()
        venv = RayVectorEnv(fns, address=config.address, num_cpus=1.0 / config.libero_envs)
        rows.append({"vector env": "RayVectorEnv", "envs": config.libero_envs,
                     "steps_per_s": _libero_steps_per_s(venv, config.libero_steps, config.seed)})  # fmt: skip
        venv.close()
    except ImportError as err:  # the libero extra is not installed
        return {"skipped": f"{type(err).__name__}: {err}"}
    rows[-1]["vs_async"] = rows[-1]["steps_per_s"] / rows[0]["steps_per_s"]
    rows[0]["vs_async"] = 1.0
    return {"task": config.libero_task, "rows": rows}


# ------------------------------------------------------------------------------ anchors
def anchor_overlap(config: ScaleConfig, progress: bool = False) -> dict[str, Any]:
    """Per-step wall and the anchors' critical-path share, synchronous vs overlapped."""
    import wmrl_envs  # noqa: F401
    from agents.grpo import train
    from agents.llm.loading import load_policy, load_world_model
    from agents.llm.scaffolds import PlanScaffold
    from agents.llm.trainer import GRPOConfig, LLMAgent
    from wmrl_envs.autoresearch.tasks import list_catalog
    from wmrl_envs.vector import make_vector_env
    from wrappers import build_stack

    world_model = load_world_model("default")
    tasks = list(list_catalog("train"))
    rows, history = [], {}
    for overlap in (False, True):
        policy = load_policy(config.anchor_policy, seed=config.seed)  # fresh, identical weights per arm
        env = make_vector_env("wmrl/AutoResearch-v0", config.anchor_slots, split="train", max_turns=1)
        stack = build_stack(
            env, "wmrl", world_model, anchor_fraction=config.anchor_fraction, seed=config.seed,
            anchor_overlap=overlap,
        )  # fmt: skip
        grpo = GRPOConfig(
            groups_per_step=config.anchor_groups, group_size=config.anchor_group_size,
            total_steps=config.anchor_steps + 1, max_new_tokens=config.max_new_tokens, seed=config.seed,
            progress=progress,
        )  # fmt: skip
        steps = train(LLMAgent(policy, stack, PlanScaffold(), grpo, tasks=tasks)).history[1:]  # step 1 warms caches up
        stack.close()
        history["overlap" if overlap else "sync"] = steps
        wall = [h["time/step_wall"] for h in steps]
        real = [h["time/real_grading_wall"] for h in steps]
        rows.append(
            {
                "anchors": "overlapped" if overlap else "in the step",
                "step_wall_s": statistics.mean(wall),
                "real_grading_on_path_s": statistics.mean(real),
                "anchor_share": statistics.mean(r / w for r, w in zip(real, wall)),
                "generation_s": statistics.mean(h["time/generation_wall"] for h in steps),
                "update_s": statistics.mean(h["time/update_wall"] for h in steps),
                "real_executions_per_step": statistics.mean(h["real_executions/step"] for h in steps),
                "rewards": [h["reward/mean"] for h in steps],
            }
        )
    rows[1]["speedup"] = rows[0]["step_wall_s"] / rows[1]["step_wall_s"]
    rows[0]["speedup"] = 1.0
    return {"policy": config.anchor_policy, "rows": rows, "history": history}


# ----------------------------------------------------------------------------- report
def _plot(result: dict[str, Any], path: Path) -> None:
    parts = [p for p in PARTS if p in result and "rows" in result[p]]
    if not parts:
        return
    fig, axes = new_figure(width=4.2 * len(parts), ncols=len(parts))
    axes = np.atleast_1d(axes)
    for ax, part in zip(axes, parts):
        rows = result[part]["rows"]
        if part == "sandbox":
            labels = [f"{r['backend']}\n{r['workers']}" for r in rows]
            ax.bar(labels, [r["runs_per_s"] for r in rows], color=["grey"] + ["tab:blue"] * (len(rows) - 1))
            ax.set_ylabel("sandbox runs / s")
            ax.set_title(f"sandbox ({result[part]['task']})")
        elif part == "libero":
            ax.bar([r["vector env"] for r in rows], [r["steps_per_s"] for r in rows], color=["grey", "tab:blue"])
            ax.set_ylabel("sub-env steps / s")
            ax.set_title(f"LIBERO-Long state-only, {rows[0]['envs']} envs")
        else:
            labels = [r["anchors"] for r in rows]
            on_path = [r["real_grading_on_path_s"] for r in rows]
            rest = [r["step_wall_s"] - p for r, p in zip(rows, on_path)]
            ax.bar(labels, rest, color="lightgrey", label="rest of the step")
            ax.bar(labels, on_path, bottom=rest, color="tab:red", label="anchors' real runs on the path")
            ax.set_ylabel("seconds per GRPO step")
            ax.set_title(f"WMRL step ({result[part]['policy']})")
            ax.legend(fontsize=7)
    save_figure(fig, path)


def _markdown(result: dict[str, Any]) -> str:
    out = []
    if "sandbox" in result:
        s = result["sandbox"]
        rounds = s.get("rounds", 1)
        out.append(
            f"### Sandbox runs per second ({s['task']}, {s['rows'][0]['runs']} reference solutions, "
            f"median of {rounds} interleaved round{'s' if rounds > 1 else ''})\n"
        )
        out.append(
            markdown_table(
                [
                    {
                        "backend": r["backend"],
                        "concurrent runs": r["workers"],
                        "seconds": f"{r['seconds']:.1f}",
                        "runs/s": f"{r['runs_per_s']:.3f}",
                        "vs local pool": f"{r['vs_local']:.2f}x",
                        "outcomes identical to local": f"{r['identical']}/{r['runs']}",
                    }
                    for r in s["rows"]
                ]
            )  # fmt: skip
        )
    if "libero" in result:
        s = result["libero"]
        out.append("\n### LIBERO-Long rollout steps per second (state-only)\n")
        if "skipped" in s:
            out.append(f"skipped: {s['skipped']}")
        else:
            out.append(
                markdown_table(
                    [{"vector env": r["vector env"], "sub-envs": r["envs"], "steps/s": f"{r['steps_per_s']:.1f}",
                      "vs AsyncVectorEnv": f"{r['vs_async']:.2f}x"} for r in s["rows"]]
                )
            )  # fmt: skip
    if "anchors" in result:
        s = result["anchors"]
        out.append(f"\n### WMRL GRPO step with anchors in the step vs overlapped ({s['policy']} policy)\n")
        out.append(
            markdown_table(
                [
                    {
                        "anchors": r["anchors"],
                        "step wall s": f"{r['step_wall_s']:.2f}",
                        "anchor real runs on the path s": f"{r['real_grading_on_path_s']:.2f}",
                        "anchor share": f"{r['anchor_share']:.0%}",
                        "generation s": f"{r['generation_s']:.2f}",
                        "update s": f"{r['update_s']:.2f}",
                        "real runs/step": f"{r['real_executions_per_step']:.1f}",
                        "step speedup": f"{r['speedup']:.2f}x",
                    }
                    for r in s["rows"]
                ]
            )  # fmt: skip
        )
    return "\n".join(out)


def run(config: ScaleConfig, run_dir: Path, *, progress: bool = True) -> dict[str, Any]:
    """Run the selected parts; writes ``results.json``, ``results.md`` and ``scale.png``."""
    result: dict[str, Any] = {"machine": machine_summary()}
    t0 = time.perf_counter()
    parts = {"sandbox": sandbox_throughput, "libero": libero_throughput, "anchors": anchor_overlap}
    for name in PARTS:
        if name in config.parts:
            result[name] = parts[name](config)
            result["seconds"] = time.perf_counter() - t0
            write_results(run_dir, result, _markdown(result))  # each part kept as soon as it is measured
    _plot(result, Path(run_dir) / "scale.png")
    return write_results(run_dir, result, _markdown(result))
