"""``speedup``: the same agent, tasks, seed and number of steps trained under three arms.

* ``real``: GRPO on real execution (every rollout runs in the sandbox);
* ``wm``: GRPO on the raw world model (``VectorWorldModelWrapper``, no real execution);
* ``wmrl``: world model + anchor groups + Online Debiasing + Inverse-Variance Denoising
  (``VectorCalibrationWrapper(VectorAnchorWrapper(VectorWorldModelWrapper(env)))``).

After one untimed warm-up pass, each arm starts from the same initial weights and trains with
:func:`agents.llm.trainer.train`; then :func:`agents.llm.evaluate.evaluate` scores the
policy on held-out (catalog ``test``) tasks by real execution (avg@k). Reported per arm:
wall-clock and CPU seconds of training, CPU seconds by component (generation, real
grading, world-model grading, update, other env time), real executions, realized anchor
share, final training reward, held-out avg@k. The speedup is the ratio of the real arm's
measured wall-clock (and CPU seconds) to each arm's, per seed. The *ideal* ratio is what
the measured component costs allow: with ``G, R, U, O`` the real arm's generation,
real-grading, update and other CPU seconds, ``W`` the WMRL arm's world-model CPU seconds
and ``a`` its realized share of real executions,

    ideal_at_anchor = (G + R + U + O) / (G + W + U + O + a R),
    ideal_no_anchor = (G + R + U + O) / (G + W + U + O)    (all real grading replaced),
    grading_limit  = R / (W + a R)                           (if generation/update were free),

so the gap between the measured speedup and its limit is visible.

Classes: :class:`SpeedupConfig`. Functions: :func:`run`, :func:`speedup_ratios`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from tqdm.auto import tqdm

from agents.llm.loading import load_policy, load_world_model
from benchmarks.common import ARMS, cpu_clock, new_figure, save_figure, summarize_seeds, task_split
from benchmarks.report import machine_summary, markdown_table, write_results
from wmrl_envs.config_cli import config_to_dict
from wmrl_envs.vector import make_vector_env
from wrappers import CalibrationConfig, build_stack

__all__ = ["SpeedupConfig", "CONFIG", "run", "speedup_ratios", "tables", "ARM_METRICS"]

NAME = "speedup"

#: Per-arm metrics (mean and spread over seeds in the summary table).
ARM_METRICS = (
    "wall_s", "cpu_s", "gen_cpu_s", "real_grading_cpu_s", "wm_grading_cpu_s", "update_cpu_s", "other_cpu_s",
    "real_executions", "anchor_share", "final_train_reward", "heldout_avg_at_k", "heldout_valid_rate",
    "heldout_reward", "anchor_weight", "calibrated",
)  # fmt: skip

RATIO_METRICS = ("wall_speedup", "cpu_speedup", "ideal_at_anchor", "ideal_no_anchor", "grading_limit", "real_exec_share")


@dataclass
class SpeedupConfig:
    """Knobs of the speedup experiment (defaults: the budgeted main job, <= 15 min on 2 cores;
    ``benchmarks/configs/speedup-main.toml`` spells them out, ``speedup-full.toml`` is the full
    comparison with the paper's calibration constants).

    Attributes:
        arms: training arms to run, from ``real``, ``wm``, ``wmrl``.
        seeds: seeds (task sampling, group ids, sampling, anchor choice); mean and spread over them.
        steps: GRPO steps per arm.
        groups_per_step: GRPO groups (task instances) per step.
        group_size: samples per group.
        max_turns: env turns per episode.
        max_new_tokens: tokens sampled per turn.
        temperature: sampling temperature.
        learning_rate: AdamW step size.
        micro_batch_size: sequences per forward/backward pass.
        policy: ``default`` (SmolLM2-135M-Instruct, offline), ``tiny`` (random from-config model) or
            ``tiny-plan`` (tiny, warm-started on example plans: smoke runs and tests).
        scaffold: ``plan`` (compact plan scaffold) or ``raw`` (raw code).
        world_model: ``default`` (shipped fitted CodeOutcomeModel) or a saved model directory.
        anchor_fraction: target share of anchor groups (WMRL arm).
        anchor_min_per_step: floor of anchor groups per step (dominates with few groups per step).
        calibration_start_pairs: anchor pairs before the first isotonic fit (paper: 200; default 4 =
            one anchor group, so calibration engages within the budgeted run).
        calibration_refit_every: refit the map after this many new pairs (paper: 64; default 4).
        calibration_half_life: EMA half-life of the disagreement, in anchor groups (paper: 64; default 4).
        calibration_freeze_after: anchor groups observed before the weight's scale freezes (paper: 32; default 2).
        train_tasks: training task ids (none = the catalog's train split).
        eval_tasks: held-out task ids (none = the catalog's test split).
        eval_max_tasks: use only the first N held-out tasks (none = all; default 3 for the budget).
        eval_k: samples per held-out task (avg@k).
        eval_before: also evaluate the initial policy (the cost-0 point of the plot).
        wall_seconds: time limit of one solution run in the sandbox.
        vectorization: ``sync`` or ``async`` vector env.
        save_policies: write each arm's trained weights to ``arms/<arm>-seed<s>/policy.pt``
            (loadable by ``leaderboard --agents checkpoint:<that dir>``; ~0.5 GB each for SmolLM2).
    """

    arms: tuple[str, ...] = ARMS
    seeds: tuple[int, ...] = (0,)
    steps: int = 3
    groups_per_step: int = 3
    group_size: int = 4
    max_turns: int = 1
    max_new_tokens: int = 48
    temperature: float = 1.0
    learning_rate: float = 1e-5
    micro_batch_size: int = 4
    policy: str = "default"
    scaffold: str = "plan"
    world_model: str = "default"
    anchor_fraction: float = 0.10
    anchor_min_per_step: int = 1
    calibration_start_pairs: int = 4
    calibration_refit_every: int = 4
    calibration_half_life: float = 4.0
    calibration_freeze_after: int = 2
    train_tasks: tuple[str, ...] | None = None
    eval_tasks: tuple[str, ...] | None = None
    eval_max_tasks: int | None = 3
    eval_k: int = 2
    eval_before: bool = False
    wall_seconds: float = 60.0
    vectorization: str = "sync"
    save_policies: bool = False

    def __post_init__(self) -> None:
        bad = [a for a in self.arms if a not in ARMS]
        if bad or not self.arms:
            raise ValueError(f"arms must be a non-empty subset of {ARMS}, got {self.arms!r}")
        if len(set(self.arms)) != len(self.arms):
            raise ValueError(f"arms repeat: {self.arms!r}")
        if not self.seeds:
            raise ValueError("seeds must name at least one seed")
        for name in ("steps", "groups_per_step", "group_size", "max_turns", "max_new_tokens", "eval_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.scaffold not in ("plan", "raw"):
            raise ValueError(f"scaffold must be 'plan' or 'raw', got {self.scaffold!r}")

    def calibration(self) -> CalibrationConfig:
        """The ``CalibrationWrapper`` settings of the WMRL arm."""
        return CalibrationConfig(
            start_pairs=self.calibration_start_pairs,
            refit_every=self.calibration_refit_every,
            max_pairs=max(5000, self.calibration_start_pairs),
            half_life=self.calibration_half_life,
            freeze_after=self.calibration_freeze_after,
        )


CONFIG = SpeedupConfig


def _sum(history: Sequence[Mapping[str, Any]], key: str) -> float:
    return float(sum(h.get(key) or 0.0 for h in history))


def _arm_row(arm: str, seed: int, history: Sequence[Mapping[str, Any]], wall: float, cpu: float, config: SpeedupConfig) -> dict[str, Any]:
    last = history[-1]
    anchors = sum((h.get("anchor/realized_fraction") or 0.0) * config.groups_per_step for h in history)
    return {
        "arm": arm,
        "seed": seed,
        "steps": len(history),
        "wall_s": wall,
        "cpu_s": cpu,
        "gen_cpu_s": _sum(history, "time/generation_cpu"),
        "real_grading_cpu_s": _sum(history, "time/real_grading_cpu"),
        "wm_grading_cpu_s": _sum(history, "time/wm_grading_cpu"),
        "update_cpu_s": _sum(history, "time/update_cpu"),
        "other_cpu_s": _sum(history, "time/env_other_cpu") + _sum(history, "time/env_reset_cpu"),
        "gen_wall_s": _sum(history, "time/generation_wall"),
        "real_grading_wall_s": _sum(history, "time/real_grading_wall"),
        "wm_grading_wall_s": _sum(history, "time/wm_grading_wall"),
        "update_wall_s": _sum(history, "time/update_wall"),
        "real_executions": int(_sum(history, "real_executions/step")),
        # Anchor groups / groups over the run (the per-step floor may dominate the target).
        "anchor_share": anchors / (len(history) * config.groups_per_step) if arm == "wmrl" else None,
        "final_train_reward": last.get("reward/mean"),
        "anchor_weight": last.get("anchor/weight") if arm == "wmrl" else None,
        "calibrated": (1.0 if last.get("calibration/fitted") else 0.0) if arm == "wmrl" else None,
        "anchor_pairs": last.get("calibration/anchor_pairs_total") if arm == "wmrl" else None,
    }


def speedup_ratios(real: Mapping[str, Any], arm: Mapping[str, Any], wmrl: Mapping[str, Any] | None) -> dict[str, Any]:
    """Measured and ideal ratios of one seed (see the module docstring); ``None`` when unknown."""

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    G, R, U, O = (real[k] for k in ("gen_cpu_s", "real_grading_cpu_s", "update_cpu_s", "other_cpu_s"))
    out: dict[str, Any] = {
        "arm": arm["arm"],
        "seed": arm["seed"],
        "wall_speedup": ratio(real["wall_s"], arm["wall_s"]),
        "cpu_speedup": ratio(real["cpu_s"], arm["cpu_s"]),
        "real_exec_share": ratio(arm["real_executions"], real["real_executions"]),
        "ideal_at_anchor": None,
        "ideal_no_anchor": None,
        "grading_limit": None,
    }
    if wmrl is not None and real["real_executions"]:
        W = wmrl["wm_grading_cpu_s"]
        a = wmrl["real_executions"] / real["real_executions"]
        out["ideal_at_anchor"] = ratio(G + R + U + O, G + W + U + O + a * R)
        out["ideal_no_anchor"] = ratio(G + R + U + O, G + W + U + O)
        out["grading_limit"] = ratio(R, W + a * R)
    return out


def _warm_up(policy: Any, batch: int, max_new_tokens: int) -> None:
    """One untimed batched generation and forward/backward pass, so the first arm does not
    pay one-off costs (lazy initialisation, allocator growth) the later arms are spared."""
    context = policy.chat_ids([{"role": "user", "content": "Write a plan: model, n_estimators, max_depth."}])
    completions = policy.generate([context] * batch, max_new_tokens=max_new_tokens, temperature=1.0, top_p=1.0, seed=0)
    seqs = [context + list(c) for c in completions]
    masks = [[0] * len(context) + [1] * len(c) for c in completions]
    logprobs, _, mask = policy.token_logprobs(seqs, masks)
    (logprobs * mask).sum().backward()
    for p in policy.trainable_parameters():
        p.grad = None


def _evaluate(policy: Any, scaffold: Any, tasks: list[str], config: SpeedupConfig, seed: int) -> dict[str, Any]:
    from agents.llm.evaluate import evaluate_heldout

    # One slot per sample of every task: a single round, so generation is batched across tasks.
    result = evaluate_heldout(
        policy, scaffold, tasks, k=config.eval_k, max_new_tokens=config.max_new_tokens, temperature=config.temperature,
        seed=10_000 + seed, vectorization=config.vectorization, max_turns=config.max_turns, wall_seconds=config.wall_seconds,
    )  # fmt: skip
    rewards = [t.mean_reward for t in result.tasks if t.mean_reward is not None]
    return {
        "heldout_avg_at_k": result.mean,
        "heldout_valid_rate": result.valid_rate,
        "heldout_reward": sum(rewards) / len(rewards) if rewards else None,
        "eval_wall_s": result.seconds,
        "eval_tasks": [t.__dict__ for t in result.tasks],
    }


def run(config: SpeedupConfig, run_dir: Path, *, progress: bool = True) -> dict[str, Any]:
    """Train every arm for every seed, evaluate, write ``results.json``, ``results.md``,
    ``heldout_vs_cost.png`` into ``run_dir`` (per-step metrics of every arm are in the JSON's
    ``histories``; trained weights under ``arms/`` with ``save_policies``)."""
    from agents.llm.scaffolds import make_scaffold
    from agents.llm.trainer import GRPOConfig, train

    started = time.perf_counter()
    load_start = os.getloadavg()
    train_tasks = task_split("train", config.train_tasks)
    eval_tasks = task_split("test", config.eval_tasks, config.eval_max_tasks)
    world_model = load_world_model(config.world_model)
    policy = load_policy(config.policy)
    initial = policy.trainable_state_dict()
    scaffold = make_scaffold(config.scaffold)
    num_envs = config.groups_per_step * config.group_size

    _warm_up(policy, num_envs, config.max_new_tokens)
    rows: list[dict[str, Any]] = []
    before: list[dict[str, Any]] = []
    histories: dict[str, list[dict[str, Any]]] = {}
    work = [(seed, arm) for seed in config.seeds for arm in config.arms]
    bar = tqdm(work, desc="speedup", disable=not progress)
    for seed, arm in bar:
        bar.set_postfix(seed=seed, arm=arm)
        policy.load_trainable_state_dict(initial)
        policy.sync_backend()
        if config.eval_before and arm == config.arms[0]:
            before.append({"seed": seed, **_evaluate(policy, scaffold, eval_tasks, config, seed)})
        env = make_vector_env(
            "wmrl/AutoResearch-v0", num_envs, vectorization=config.vectorization, split="train", max_turns=config.max_turns, wall_seconds=config.wall_seconds
        )
        stack = build_stack(
            env, arm, world_model, anchor_fraction=config.anchor_fraction, anchor_min_per_step=config.anchor_min_per_step, seed=seed,
            calibration=config.calibration(),
        )  # fmt: skip
        grpo = GRPOConfig(
            groups_per_step=config.groups_per_step, group_size=config.group_size, total_steps=config.steps,
            max_new_tokens=config.max_new_tokens, temperature=config.temperature, learning_rate=config.learning_rate,
            micro_batch_size=config.micro_batch_size, seed=seed, progress=progress,
        )  # fmt: skip
        wall0, cpu0 = time.perf_counter(), cpu_clock()
        try:
            history = train(policy, stack, scaffold, grpo, tasks=train_tasks).history
        finally:
            wall, cpu = time.perf_counter() - wall0, cpu_clock() - cpu0
            stack.close()
        histories[f"{arm}-seed{seed}"] = history
        if config.save_policies:  # only the weights: the trainer's checkpoint adds the optimiser (x3 size)
            import torch

            (run_dir / "arms" / f"{arm}-seed{seed}").mkdir(parents=True, exist_ok=True)
            torch.save(policy.trainable_state_dict(), run_dir / "arms" / f"{arm}-seed{seed}" / "policy.pt")
        row = _arm_row(arm, seed, history, wall, cpu, config)
        row.update(_evaluate(policy, scaffold, eval_tasks, config, seed))
        rows.append(row)
    bar.close()

    ratios = []
    for seed in config.seeds:
        by_arm = {r["arm"]: r for r in rows if r["seed"] == seed}
        if "real" in by_arm:
            ratios += [speedup_ratios(by_arm["real"], by_arm[a], by_arm.get("wmrl")) for a in config.arms if a != "real"]
    summary = summarize_seeds(rows, "arm", ARM_METRICS)
    ratio_summary = summarize_seeds(ratios, "arm", RATIO_METRICS) if ratios else []
    before_summary = summarize_seeds([{"arm": "initial", **b} for b in before], "arm", ("heldout_avg_at_k", "heldout_valid_rate", "heldout_reward")) if before else []

    result = {
        "experiment": NAME,
        "config": config_to_dict(config),
        "machine": machine_summary(),
        "load_average": {"start": load_start, "end": os.getloadavg()},
        "total_wall_s": time.perf_counter() - started,
        "train_tasks": train_tasks,
        "eval_tasks": eval_tasks,
        "arms": summary,
        "ratios": ratio_summary,
        "initial_policy": before_summary,
        "per_seed": {"arms": [{k: v for k, v in r.items() if k != "eval_tasks"} for r in rows], "ratios": ratios, "initial": before},
        "eval_tasks_per_arm": {f"{r['arm']}-seed{r['seed']}": r["eval_tasks"] for r in rows},
        "histories": histories,
    }
    plot = _plot(summary, before_summary, run_dir / "heldout_vs_cost.png")
    result["plot"] = str(plot)
    return write_results(run_dir, result, tables(result))


def _pm(row: Mapping[str, Any], key: str, digits: int = 3) -> str | None:
    mean, sd = row.get(key), row.get(f"{key}_sd")
    if mean is None:
        return None
    text = f"{mean:.{digits}g}" if abs(mean) < 1000 else f"{mean:,.0f}"
    return text if not sd else f"{text} ± {sd:.2g}"


def tables(result: Mapping[str, Any]) -> str:
    """The Markdown tables of a speedup result (mean ± sample sd over seeds)."""
    cfg = result["config"]
    arm_rows = [
        {
            "arm": r["arm"], "seeds": r["seeds"], "wall s": _pm(r, "wall_s"), "CPU s": _pm(r, "cpu_s"),
            "gen CPU s": _pm(r, "gen_cpu_s"), "real grading CPU s": _pm(r, "real_grading_cpu_s"),
            "WM grading CPU s": _pm(r, "wm_grading_cpu_s"), "update CPU s": _pm(r, "update_cpu_s"),
            "other CPU s": _pm(r, "other_cpu_s"), "real executions": _pm(r, "real_executions"),
            "anchor share": _pm(r, "anchor_share"), "final train reward": _pm(r, "final_train_reward"),
            f"held-out avg@{cfg['eval_k']}": _pm(r, "heldout_avg_at_k"), "held-out valid rate": _pm(r, "heldout_valid_rate"),
            "held-out reward": _pm(r, "heldout_reward"),
        }
        for r in result["arms"]
    ]  # fmt: skip
    parts = [markdown_table(arm_rows)]
    if result["ratios"]:
        ratio_rows = [
            {
                "arm vs real": r["arm"], "wall speedup": _pm(r, "wall_speedup"), "CPU speedup": _pm(r, "cpu_speedup"),
                "real-exec share": _pm(r, "real_exec_share"), "ideal (at anchor share)": _pm(r, "ideal_at_anchor"),
                "ideal (no anchors)": _pm(r, "ideal_no_anchor"), "grading-only limit": _pm(r, "grading_limit"),
            }
            for r in result["ratios"]
        ]  # fmt: skip
        parts.append(markdown_table(ratio_rows))
    for r in result.get("initial_policy") or []:
        parts.append(f"Initial policy (before training): held-out avg@{cfg['eval_k']} {_pm(r, 'heldout_avg_at_k')}, valid rate {_pm(r, 'heldout_valid_rate')}, reward {_pm(r, 'heldout_reward')}.")
    wmrl = next((r for r in result["arms"] if r["arm"] == "wmrl"), None)
    if wmrl is not None:
        parts.append(
            f"WMRL anchors: target fraction {cfg['anchor_fraction']}, floor {cfg['anchor_min_per_step']} per step of "
            f"{cfg['groups_per_step']} groups -> realized share {_pm(wmrl, 'anchor_share')}; calibration fitted at the end: "
            f"{_pm(wmrl, 'calibrated')} (start_pairs={cfg['calibration_start_pairs']}), final anchor weight {_pm(wmrl, 'anchor_weight')}."
        )
    load = result["load_average"]
    parts.append(f"Load average (1/5/15 min) at start {tuple(round(x, 1) for x in load['start'])}, at end {tuple(round(x, 1) for x in load['end'])}; {result['machine']['cpus']} CPUs; total {result['total_wall_s']:.0f} s.")
    return "\n\n".join(parts)


def _plot(summary: Sequence[Mapping[str, Any]], before: Sequence[Mapping[str, Any]], path: Path) -> Path:
    use_score = all(r.get("heldout_avg_at_k") is not None for r in summary)
    key, label = ("heldout_avg_at_k", "held-out avg@k (real execution)") if use_score else ("heldout_reward", "held-out mean reward\n(avg@k unknown: no leaderboards)")
    fig, ax = new_figure()
    for r in summary:
        ax.errorbar(r["cpu_s"], r[key] if r[key] is not None else float("nan"), xerr=r["cpu_s_sd"] or 0, yerr=r[f"{key}_sd"] or 0, fmt="o", capsize=3, label=r["arm"])
    for b in before:
        if b.get(key) is not None:
            ax.axhline(b[key], color="grey", ls="--", lw=1, label="initial policy")
    ax.set_xlabel("training CPU seconds (this process + sandbox children)")
    ax.set_ylabel(label)
    ax.set_title("held-out score vs training cost")
    ax.legend()
    return save_figure(fig, path)
