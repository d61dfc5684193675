"""``speedup``: three arms trained under the same compute budget; held-out score vs cost.

* ``real``: GRPO on real execution (every rollout runs in the sandbox);
* ``wm``: GRPO on the raw world model (``VectorWorldModelWrapper``, no real execution);
* ``wmrl``: world model + anchor groups + Online Debiasing + Inverse-Variance Denoising.

Every arm starts from the same initial weights and trains with
:func:`agents.grpo.train` until it has spent ``budget_cpu_s`` CPU-seconds (this process
plus its sandbox children; wall-clock is reported too). Whenever an arm's spent cost crosses one
of ``eval_fractions`` of the budget, the policy is scored on the tier's held-out tasks by real
execution (avg@k); evaluation is untimed: its CPU and wall are subtracted from the arm's cost.
Held-out executions are memoised per (task, script, limits): the plan scaffold renders
deterministic scripts (fixed ``random_state``), so a repeated script has the outcome already
measured; training never uses the memo (the real arm pays for every run).

Reported per arm (mean ± sd over seeds): the held-out-vs-cost curve (plot), cost by component,
steps, real executions, realized anchor share; and the headline, per seed,

    ratio = cost at which the real arm reaches its final held-out score
            / cost at which WMRL first reaches that score     (linear interpolation),

("not reached" when WMRL never does within its budget; undefined when the real arm ends no
higher than where it started), next to the *ideal* ratio that the measured per-step component
costs allow: with ``G, R, U, O`` the real arm's generation, real-grading, update and other CPU
seconds per step, ``W`` the WMRL arm's world-model CPU per step and ``a`` its realized share of
real executions, ``ideal = (G + R + U + O) / (G + W + U + O + a R)`` (steps per CPU-second,
WMRL over real: the speedup if a WMRL step were worth a real one).

The WMRL arm also logs the world-model exploitation monitor (:mod:`wrappers.parts.monitor`): the gap
between calibrated world-model and real scores on anchor groups, and their within-group rank
agreement, over training (``monitor.png``); ``monitor_max_gap`` lets
:class:`~agents.grpo.ExploitationGuard` raise the anchor fraction or stop.

A multi-seed run can be summarised from its saved arms at any time:
``python -m benchmarks.speedup RUN_DIR`` (:func:`summary_from_arms`) writes
``summary-partial.json`` and ``heldout_vs_cost-partial.png`` over the seeds whose every arm
finished, or, once every planned seed has, ``summary.json`` and ``heldout_vs_cost.png`` as the
run itself writes them (so a finished run's summary can be re-derived, e.g. after the summary
gains a field).

Classes: :class:`SpeedupConfig`. Functions: :func:`run`, :func:`summary_from_arms`,
:func:`cost_to_reach`, :func:`headline`, :func:`tables`.
"""

from __future__ import annotations

import gzip
import json
import os
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from tqdm.auto import tqdm

from agents.grpo.loop import GUARD_ACTIONS
from agents.grpo.shadow import summarize_probes
from agents.llm.loading import load_policy, load_world_model, warm_start_plans
from benchmarks.common import cpu_clock, cpu_probe, new_figure, save_figure, summarize_seeds
from benchmarks.report import machine_summary, markdown_table, write_json, write_results
from benchmarks.speedup_accounting import OutcomeCache, bootstrap_ci, reach_ratios
from wmrl_envs.config_cli import build_config, config_to_dict
from wmrl_envs.vector import make_vector_env
from wrappers import CalibrationConfig, StackHandle, build_stack
from wrappers.parts.scheduling import SELECTIONS

__all__ = [
    "RICH_PLAN_TOKENS",
    "SpeedupConfig",
    "CONFIG",
    "run",
    "cost_to_reach",
    "headline",
    "tables",
    "ARM_METRICS",
    "COLLAPSED_MALFORMED_RATE",
    "SPEEDUP_ARMS",
    "OPTIONAL_ARMS",
    "build_summary",
    "summary_from_arms",
]

NAME = "speedup"

#: Per-arm metrics (mean and spread over seeds in the summary table).
ARM_METRICS = (
    "cost_cpu_s", "wall_s", "steps", "gen_cpu_s", "real_grading_cpu_s", "wm_grading_cpu_s", "update_cpu_s",
    "other_cpu_s", "real_executions", "anchor_share", "final_heldout", "best_heldout", "step_cpu_s",
    "final_train_reward", "anchor_weight", "monitor_gap", "monitor_rank_agreement", "cache_hits",
    "distinct_scripts_per_task", "anchor_cpu_share", "informative_anchor_share", "anchor_weight_mean",
    "collapsed_step_share", "rollbacks",
)  # fmt: skip

#: A step of a run collapsed off the scaffold's format: at least this share of its replies malformed
#: (``docs/results/format-collapse/``; its ``spells`` count runs of such steps the same way).
COLLAPSED_MALFORMED_RATE = 0.9

#: The shadow probe's numbers averaged over seeds in ``summary.json`` (see :class:`~agents.grpo.ShadowProbe`).
SHADOW_METRICS = (
    "raw_gap_start", "raw_gap_end", "raw_gap_mean", "raw_gap_slope_per_step", "calibrated_gap_start",
    "calibrated_gap_end", "calibrated_gap_mean", "calibrated_gap_slope_per_step", "executions", "unknown_real",
)  # fmt: skip

#: The WMRL arm's anchor metrics (see :func:`anchor_fields`), with CIs in ``summary.json``.
ANCHOR_METRICS = ("anchor_cpu_share", "informative_anchor_share", "anchor_weight_mean")

#: Why an anchor group taught nothing (the monitor's ``flat_true_groups``, ...): its real scores
#: were all equal, its calibrated scores were, or it had one known (calibrated, real) pair only.
UNINFORMATIVE_REASONS = ("flat_true", "flat_calibrated", "single_pair")

#: The default arms: the three stacks, plus ``real1`` -- real execution with one group per
#: step, so it takes as many optimizer steps per CPU-second as its execution cost allows
#: (separates "cheaper reward" from "more steps").
SPEEDUP_ARMS = ("real", "real1", "wm", "wmrl")

#: Arms a config may add: ``wmrl-informative`` is the ``wmrl`` stack with informative anchor
#: selection whatever ``anchor_selection`` says, so one run can hold the paper's random anchors
#: and the informative ones side by side.
OPTIONAL_ARMS = ("wmrl-informative",)

#: Arms that run the ``wmrl`` stack (anchors, calibration, denoising).
ANCHORED_ARMS = ("wmrl", "wmrl-informative")

#: Arms graded by the world model (charged its one-off cost; shadow-probed).
WORLD_MODEL_ARMS = ("wm", *ANCHORED_ARMS)

#: The stack each arm runs (an arm not listed runs the stack of its own name).
_ARM_STACK = {"real1": "real", "wmrl-informative": "wmrl"}

RATIO_METRICS = ("reach_ratio", "ideal_ratio", "real_reach_cost", "wmrl_reach_cost")


#: Tokens a rich-grammar plan takes with the tiny policy's tokenizer (63-76 measured on 8
#: random plans, plus room): the smallest ``max_new_tokens`` the ``rich`` scaffold accepts.
RICH_PLAN_TOKENS = 96


@dataclass
class SpeedupConfig:
    """Knobs of the budget-matched speedup (defaults: the main job, <= 15 min on 2 cores).

    Attributes:
        arms: training arms to run: :data:`SPEEDUP_ARMS` (``real``, ``real1``, ``wm``, ``wmrl``, the
            default) and :data:`OPTIONAL_ARMS` (``wmrl-informative``).
        seeds: seeds (task sampling, sampling, anchor choice); mean and spread over them.
        tier: AutoResearch task tier: ``full`` (20-40k-row tables, runs of seconds to minutes)
            or ``small`` (the 2,500-row catalog).
        budget_cpu_s: compute budget of each arm in CPU-seconds (process + sandbox children).
        eval_fractions: fractions of the budget at which the held-out score is measured.
        max_steps: safety cap on steps per arm (an arm normally stops on its budget).
        groups_per_step: GRPO groups (task instances) per step.
        group_size: samples per group.
        max_turns: env turns per episode.
        max_new_tokens: tokens sampled per turn.
        temperature: sampling temperature in training.
        learning_rate: AdamW step size.
        micro_batch_size: sequences per forward/backward pass.
        policy: ``tiny`` (a small from-config model: with the warm start below it writes valid
            plans and learns within minutes on CPU), ``default`` (SmolLM2-135M-Instruct) or
            ``tiny-plan`` (tiny with the library's short 30-step warm start).
        warm_start_steps: supervised steps on demonstrations before any arm starts (untimed,
            shared by all arms; 0 = none): example plans, or for the ``raw`` scaffold the agent
            corpus's valid train-split scripts (:func:`agents.llm.loading.warm_start_plans`).
        warm_start_lr: learning rate of that warm start.
        warm_start_batch_size: demonstrations per warm-start step (none = all of them).
        scaffold: ``plan`` (compact plan scaffold: one of six model families, a few clamped
            hyperparameters; ~12 distinct scripts per task in practice), ``rich`` (the
            agent-style plan grammar of :mod:`wmrl_envs.autoresearch.plans`: > 10^4 scripts per
            task, including settings over the task's limits; needs ``max_new_tokens`` >=
            :data:`RICH_PLAN_TOKENS`) or ``raw`` (raw code).
        world_model: ``out-of-sample`` (fitted at the start of the run on every shipped log
            whose task is none of the policy's training or held-out tasks; its fit set, the
            overlap (``[]``) and its one-off cost are in ``summary.json``), ``default`` (the
            shipped model, which has seen the catalog's train split) or a saved model directory.
        outcome_cache: every arm executes a distinct (script, inputs, limits) once; repeats
            are served from the arm's own cache (counted, free). Arms never share a cache.
        anchor_fraction: target share of anchor groups (WMRL arm).
        anchor_min_per_step: floor of anchor groups per step (0: the target share is met over
            the run by error diffusion, not forced to one group per step).
        anchor_selection: ``random`` (the paper's: anchor groups drawn before any member is
            sampled), ``informative`` (drawn after the members' first actions, among groups
            with >= 2 distinct scripts) or ``least-confident`` (the same, the world model's
            least confident first): see :class:`~wrappers.VectorAnchorWrapper`.
        anchor_keep_share: the last two: grade one-script groups for real when a step has too
            few others to meet its share (``VectorAnchorWrapper(keep_share=...)``); ``false``
            carries the deficit instead (the protocols started before 2026-12-06 pin it).
        calibration_start_pairs: anchor pairs before the first isotonic fit (paper: 200).
        calibration_start_rule: ``count`` (the paper's) or ``cv`` (see CalibrationConfig).
        shadow_every: ``wm`` and ``wmrl`` arms: every this many steps grade ``shadow_sample`` of
            the step's world-model-graded scripts for real, outside the budget and the arm's
            outcome cache (:class:`~agents.grpo.ShadowProbe`); 0 = never. The row and
            ``summary.json`` then carry the raw and calibrated gap over training.
        shadow_sample: scripts per probe.
        wm_update_every: WMRL arm: refit its world model on the real outcomes of its anchor
            scripts every this many anchor records (:class:`~agents.grpo.WorldModelUpdater`; the
            refits' CPU is the arm's); 0 = never (the paper's). The row then carries the
            fidelity on held-back anchor scripts with and without the updates.
        calibration_refit_every: refit the map after this many new pairs (paper: 64).
        calibration_half_life: EMA half-life of the disagreement, in anchor groups (paper: 64).
        calibration_freeze_after: anchor groups before the weight's scale freezes (paper: 32).
        monitor_max_gap: threshold of the exploitation monitor's smoothed gap (none = watch only: the
            arms run without the training loop's default guard, so they are the paper's recipe).
        monitor_action: ``raise`` (double the anchor fraction), ``stop`` or ``escalate`` (raise, then
            stop at the guard's maximum fraction) when the gap exceeds it.
        train_tasks: training task ids (none = the tier's train split).
        eval_tasks: held-out task ids (none = the tier's test split).
        eval_max_tasks: use only the first N held-out tasks (none = all).
        eval_k: samples per held-out task (avg@k).
        eval_temperature: sampling temperature of the held-out evaluation.
        wall_seconds: time limit of one solution run (none = each task's own limit).
        vectorization: ``sync`` or ``async`` vector env (``sync`` keeps the CPU clock exact).
        threads: torch CPU threads of the policy (1 spends the least CPU per token).
        save_policies: write each arm's final weights to ``arms/<arm>-seed<s>/policy.pt``.
        max_rollbacks: the training loop's rollbacks after a collapse off the scaffold's format
            (``GRPOLoopConfig.max_rollbacks``: the last policy whose replies were mostly valid is
            restored at half the learning rate); 0 = a collapsed arm stays collapsed, as in every
            protocol run before 2026-12-07 (their configs pin it).
        warmup_steps: the training loop's linear learning-rate warmup, in optimiser steps
            (``GRPOLoopConfig.warmup_steps``; 0 = none, as every protocol run so far).
        beta: the k3 KL term to the warm-started policy (``GRPOLoopConfig.beta``; 0 = none, as
            every protocol run so far).
        workers: arms of a seed trained side by side, each in its own process (1 = one after
            another in this process). An arm's budget is its own process's CPU clock, so
            side-by-side arms are charged the same way; 2 on a 2-core machine halves the wall
            time. Arms sharing the machine's caches and memory bandwidth take a little more CPU
            per step than alone, so compare step counts within one setting.
    """

    arms: tuple[str, ...] = SPEEDUP_ARMS
    seeds: tuple[int, ...] = (0,)
    tier: str = "full"
    budget_cpu_s: float = 120.0
    eval_fractions: tuple[float, ...] = (0.0, 0.5, 1.0)
    max_steps: int = 400
    groups_per_step: int = 4
    group_size: int = 4
    max_turns: int = 1
    max_new_tokens: int = 32
    temperature: float = 1.0
    learning_rate: float = 1e-3
    micro_batch_size: int = 8
    policy: str = "tiny"
    warm_start_steps: int = 150
    warm_start_lr: float = 5e-3
    warm_start_batch_size: int | None = None
    scaffold: str = "plan"
    world_model: str = "out-of-sample"
    outcome_cache: bool = True
    anchor_fraction: float = 0.10
    anchor_min_per_step: int = 0
    anchor_selection: str = "random"
    anchor_keep_share: bool = True
    calibration_start_pairs: int = 16
    calibration_start_rule: str = "count"
    wm_update_every: int = 0
    shadow_every: int = 0
    shadow_sample: int = 4
    calibration_refit_every: int = 16
    calibration_half_life: float = 8.0
    calibration_freeze_after: int = 4
    monitor_max_gap: float | None = None
    monitor_action: str = "raise"
    train_tasks: tuple[str, ...] | None = None
    eval_tasks: tuple[str, ...] | None = None
    eval_max_tasks: int | None = None
    eval_k: int = 2
    eval_temperature: float = 1.0
    wall_seconds: float | None = None
    vectorization: str = "sync"
    threads: int = 1
    save_policies: bool = False
    max_rollbacks: int = 3
    warmup_steps: int = 0
    beta: float = 0.0
    workers: int = 2

    def __post_init__(self) -> None:
        known = SPEEDUP_ARMS + OPTIONAL_ARMS
        bad = [a for a in self.arms if a not in known]
        if bad or not self.arms or len(set(self.arms)) != len(self.arms):
            raise ValueError(f"arms must be distinct names from {known}, got {self.arms!r}")
        if not self.seeds:
            raise ValueError("seeds must name at least one seed")
        if self.tier not in ("small", "full"):
            raise ValueError(f"tier must be 'small' or 'full', got {self.tier!r}")
        if not self.budget_cpu_s > 0:
            raise ValueError(f"budget_cpu_s must be > 0, got {self.budget_cpu_s}")
        if (
            not self.eval_fractions
            or any(not 0.0 <= f <= 1.0 for f in self.eval_fractions)
            or list(self.eval_fractions) != sorted(set(self.eval_fractions))
        ):
            raise ValueError(f"eval_fractions must be increasing fractions in [0, 1], got {self.eval_fractions!r}")
        for name in ("max_steps", "groups_per_step", "group_size", "max_turns", "max_new_tokens", "eval_k", "workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.scaffold not in ("plan", "rich", "raw"):
            raise ValueError(f"scaffold must be 'plan', 'rich' or 'raw', got {self.scaffold!r}")
        if self.scaffold == "rich" and self.max_new_tokens < RICH_PLAN_TOKENS:
            # a truncated plan parses to fewer choices than it names: the action space would shrink silently
            raise ValueError(
                f"the rich scaffold's plans take up to ~{RICH_PLAN_TOKENS} tokens; max_new_tokens={self.max_new_tokens} cuts them"
            )
        if self.vectorization not in ("sync", "async"):
            # Ray workers' CPU is not this process's or its children's: the budget could not see it.
            raise ValueError(f"vectorization must be 'sync' or 'async', got {self.vectorization!r}")
        self.calibration()  # validates the calibration settings
        if self.anchor_selection not in SELECTIONS:
            raise ValueError(f"anchor_selection must be one of {SELECTIONS}, got {self.anchor_selection!r}")
        if self.monitor_action not in GUARD_ACTIONS:
            raise ValueError(f"monitor_action must be one of {GUARD_ACTIONS}, got {self.monitor_action!r}")
        if self.wm_update_every < 0 or self.shadow_every < 0 or self.shadow_sample < 1:
            raise ValueError(
                f"wm_update_every and shadow_every must be >= 0 (0 = never) and shadow_sample >= 1, got "
                f"{self.wm_update_every}, {self.shadow_every}, {self.shadow_sample}"
            )

    def calibration(self) -> CalibrationConfig:
        """The ``CalibrationWrapper`` settings of the WMRL arm."""
        return CalibrationConfig(
            start_pairs=self.calibration_start_pairs,
            start_rule=self.calibration_start_rule,
            refit_every=self.calibration_refit_every,
            max_pairs=max(5000, self.calibration_start_pairs),
            half_life=self.calibration_half_life,
            freeze_after=self.calibration_freeze_after,
        )

    def env_kwargs(self) -> dict[str, Any]:
        return {
            "max_turns": self.max_turns,
            "tier": self.tier,
            **({"wall_seconds": self.wall_seconds} if self.wall_seconds else {}),
        }


CONFIG = SpeedupConfig


# ------------------------------------------------------------------ held-out evaluation
def _evaluate(
    policy: Any, scaffold: Any, tasks: list[str], config: SpeedupConfig, seed: int, memo: OutcomeCache
) -> dict[str, Any]:
    from agents.llm.evaluate import evaluate_heldout

    wall0, cpu0 = time.perf_counter(), cpu_clock()
    result = evaluate_heldout(
        policy, scaffold, tasks, k=config.eval_k, max_new_tokens=config.max_new_tokens, temperature=config.eval_temperature,
        seed=10_000 + seed, vectorization="sync", executor=memo, **config.env_kwargs(),
    )  # fmt: skip
    return {
        "heldout": result.mean,
        "valid_rate": result.valid_rate,
        "tasks": {t.task_id: t.score for t in result.tasks},
        "eval_wall_s": time.perf_counter() - wall0,
        "eval_cpu_s": cpu_clock() - cpu0,
    }


# ------------------------------------------------------------------ one arm under a budget
class _Budget:
    """Trainer callback: stops the arm when its spent cost reaches the budget, and evaluates
    (untimed) whenever the spent cost crosses the next evaluation fraction."""

    def __init__(self, config: SpeedupConfig, evaluate: Any, first_point: dict[str, Any] | None) -> None:
        self.config = config
        self.evaluate = evaluate
        self.wall0, self.cpu0 = time.perf_counter(), cpu_clock()
        self.excluded_cpu = self.excluded_wall = 0.0
        self.untimed: list[Any] = []  # callbacks with their own cpu_s / wall_s outside the budget (probes)
        self.points: list[dict[str, Any]] = []
        self.pending = [f for f in config.eval_fractions]
        if first_point is not None and self.pending and self.pending[0] == 0.0:
            self.points.append({"fraction": 0.0, "step": 0, "cost_cpu_s": 0.0, "wall_s": 0.0, **first_point})
            self.pending.pop(0)

    def spent(self) -> tuple[float, float]:
        cpu = self.excluded_cpu + sum(u.cpu_s for u in self.untimed)
        wall = self.excluded_wall + sum(u.wall_s for u in self.untimed)
        return cpu_clock() - self.cpu0 - cpu, time.perf_counter() - self.wall0 - wall

    def measure(self, step: int) -> None:
        cost, wall = self.spent()
        point = self.evaluate()
        self.excluded_cpu += point.pop("eval_cpu_s")
        self.excluded_wall += point.pop("eval_wall_s")
        self.points.append(
            {
                "fraction": min(1.0, cost / self.config.budget_cpu_s),
                "step": step,
                "cost_cpu_s": cost,
                "wall_s": wall,
                **point,
            }
        )

    def __call__(self, step: int, metrics: dict[str, Any]) -> bool:
        cost, _ = self.spent()
        done = cost >= self.config.budget_cpu_s or step >= self.config.max_steps
        crossed = [f for f in self.pending if cost >= f * self.config.budget_cpu_s]
        if crossed or (done and self.pending):
            self.pending = [f for f in self.pending if f not in crossed and not done]
            self.measure(step)
        return done


def _sum(history: Sequence[Mapping[str, Any]], key: str) -> float:
    return float(sum(h.get(key) or 0.0 for h in history))


def _arm_row(
    arm: str,
    seed: int,
    history: Sequence[Mapping[str, Any]],
    budget: _Budget,
    config: SpeedupConfig,
    groups_per_step: int,
) -> dict[str, Any]:
    cost, wall = budget.spent()
    steps = len(history)
    groups = steps * groups_per_step
    anchors = sum((h.get("groups/anchor") or 0) for h in history)
    gaps = [h["monitor/gap"] for h in history if h.get("monitor/gap") is not None]
    ranks = [h["monitor/rank_agreement"] for h in history if h.get("monitor/rank_agreement") is not None]
    scores = [p["heldout"] for p in budget.points if p["heldout"] is not None]
    last = history[-1] if history else {}
    return {
        "arm": arm,
        "seed": seed,
        "steps": steps,
        "cost_cpu_s": cost,
        "wall_s": wall,
        "step_cpu_s": cost / steps if steps else None,
        "gen_cpu_s": _sum(history, "time/generation_cpu"),
        "real_grading_cpu_s": _sum(history, "time/real_grading_cpu"),
        "wm_grading_cpu_s": _sum(history, "time/wm_grading_cpu"),
        "update_cpu_s": _sum(history, "time/update_cpu"),
        "other_cpu_s": _sum(history, "time/env_other_cpu") + _sum(history, "time/env_reset_cpu"),
        "real_executions": int(_sum(history, "real_executions/step")),
        "anchor_share": anchors / groups if arm in ANCHORED_ARMS and groups else None,
        "final_heldout": budget.points[-1]["heldout"] if budget.points else None,
        "best_heldout": max(scores) if scores else None,
        "final_train_reward": last.get("reward/mean"),
        "anchor_weight": last.get("anchor/weight") if arm in ANCHORED_ARMS else None,
        "monitor_gap": float(np.mean(gaps)) if gaps else None,
        "monitor_rank_agreement": float(np.mean(ranks)) if ranks else None,
        **anchor_fields(arm, history, cost),
        **format_fields(history),
        "curve": budget.points,
    }


def format_fields(history: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """How much of a run was collapsed off the scaffold's format: ``collapsed_step_share`` (steps
    with >= :data:`COLLAPSED_MALFORMED_RATE` of their replies malformed; ``None`` for an agent
    that reports no reply rates) and ``rollbacks`` (the loop's restores after a collapse; 0 for
    runs recorded before the loop logged them).

    >>> format_fields([{"reward/malformed_rate": 1.0, "train/rollbacks": 0}, {"reward/malformed_rate": 0.25, "train/rollbacks": 1}])
    {'collapsed_step_share': 0.5, 'rollbacks': 1}
    """
    rates = [h["reward/malformed_rate"] for h in history if h.get("reward/malformed_rate") is not None]
    return {
        "collapsed_step_share": sum(r >= COLLAPSED_MALFORMED_RATE for r in rates) / len(rates) if rates else None,
        "rollbacks": int(history[-1].get("train/rollbacks") or 0) if history else 0,
    }


def anchor_fields(arm: str, history: Sequence[Mapping[str, Any]], cost_cpu_s: float) -> dict[str, Any]:
    """What the WMRL arm's anchors bought (``None`` for the other arms): ``anchor_cpu_share``
    (real grading CPU -- all of it anchors -- over the arm's CPU), ``informative_anchor_share``
    (anchor groups with a spread in both calibrated and real scores, over the anchor groups
    with any known pair), ``anchor_weight_mean`` over steps, ``anchor_weight_trajectory``
    (``[step, weight, its standard error or None]`` at the first step and wherever the weight
    changed) and ``uninformative_anchor_reasons``: the shares of those anchor groups whose real
    scores were all equal (``flat_true``), whose calibrated scores were (``flat_calibrated``; a
    group can be both) or that had one known pair only (``single_pair``) -- ``None`` for runs
    recorded before the monitor counted them."""
    if arm not in ANCHORED_ARMS:
        return dict.fromkeys(ANCHOR_METRICS + ("anchor_weight_trajectory", "uninformative_anchor_reasons"))
    monitored = _sum(history, "monitor/anchor_groups")
    weights = [
        (int(h["step"]), float(h["anchor/weight"]), h.get("anchor/weight_se"))
        for h in history
        if h.get("anchor/weight") is not None
    ]
    return {
        "anchor_cpu_share": _sum(history, "time/real_grading_cpu") / cost_cpu_s if cost_cpu_s > 0 else None,
        "informative_anchor_share": _sum(history, "monitor/informative_groups") / monitored if monitored else None,
        "anchor_weight_mean": float(np.mean([w for _, w, _ in weights])) if weights else None,
        "anchor_weight_trajectory": [
            [s, w, se] for k, (s, w, se) in enumerate(weights) if k == 0 or w != weights[k - 1][1]
        ],
        "uninformative_anchor_reasons": {
            reason: _sum(history, f"monitor/{reason}_groups") / monitored for reason in UNINFORMATIVE_REASONS
        }
        if monitored and any(f"monitor/{UNINFORMATIVE_REASONS[0]}_groups" in h for h in history)
        else None,
    }


# ------------------------------------------------------------------ the headline
def cost_to_reach(curve: Sequence[Mapping[str, Any]], target: float) -> float | None:
    """The first cost at which the piecewise-linear held-out curve reaches ``target``
    (``None`` if it never does). Points with an unknown score are skipped.

    >>> cost_to_reach([{"cost_cpu_s": 0, "heldout": 0.2}, {"cost_cpu_s": 10, "heldout": 0.6}], 0.4)
    5.0
    """
    points = [(float(p["cost_cpu_s"]), float(p["heldout"])) for p in curve if p.get("heldout") is not None]
    for k, (c, s) in enumerate(points):
        if s >= target:
            if k == 0:
                return c
            c0, s0 = points[k - 1]
            return c0 + (c - c0) * (target - s0) / (s - s0)
    return None


def headline(real: Mapping[str, Any], wmrl: Mapping[str, Any]) -> dict[str, Any]:
    """The cost-to-reach ratio of one seed (see the module docstring), with the reason when
    it is undefined, and the ideal ratio of the measured per-step component costs."""
    out: dict[str, Any] = {
        "seed": real["seed"],
        "reach_ratio": None,
        "real_reach_cost": None,
        "wmrl_reach_cost": None,
        "ideal_ratio": None,
    }
    if real["steps"] and wmrl["steps"] and real["real_executions"]:
        g, r, u, o = (
            real[k] / real["steps"] for k in ("gen_cpu_s", "real_grading_cpu_s", "update_cpu_s", "other_cpu_s")
        )
        share = (wmrl["real_executions"] / wmrl["steps"]) / (real["real_executions"] / real["steps"])
        w = wmrl["wm_grading_cpu_s"] / wmrl["steps"]
        out["ideal_ratio"] = (g + r + u + o) / (g + w + u + o + share * r)
    curve = real["curve"]
    known = [p["heldout"] for p in curve if p["heldout"] is not None]
    if len(known) < 2:
        out["note"] = "real arm: fewer than two held-out points"
        return out
    target = known[-1]
    if target <= known[0]:
        out["note"] = f"undefined: the real arm ended at {target:.3f}, no higher than its start ({known[0]:.3f})"
        return out
    out["real_reach_cost"] = cost_to_reach(curve, target)
    out["wmrl_reach_cost"] = cost_to_reach(wmrl["curve"], target)
    if out["wmrl_reach_cost"] is None:
        out["note"] = f"WMRL did not reach the real arm's final {target:.3f} within its budget"
    elif out["wmrl_reach_cost"] > 0:
        out["reach_ratio"] = out["real_reach_cost"] / out["wmrl_reach_cost"]
        out["note"] = f"target {target:.3f}"
    return out


# ------------------------------------------------------------------ run
def _world_model(config: SpeedupConfig, policy_tasks: Sequence[str], run_dir: Path) -> tuple[Any, dict[str, Any]]:
    """The graders' world model and its provenance: fitted out of sample (saved in the run
    directory, so a resumed run reuses it and its recorded one-off cost), or loaded."""
    from benchmarks.speedup_accounting import fit_out_of_sample_world_model
    from wmrl_envs.world_models import CodeOutcomeModel

    if config.world_model != "out-of-sample":
        model = load_world_model(config.world_model)
        fit_tasks = sorted(set(model.info.get("tasks", []))) if hasattr(model, "info") else []
        return model, {
            "source": config.world_model, "fit_tasks": fit_tasks, "overlap": sorted(set(fit_tasks) & set(policy_tasks)),
            "fit_cpu_s": None, "fit_logged_cpu_s": None,
        }  # fmt: skip
    where = run_dir / "world_model"
    if (where / "provenance.json").is_file():
        return CodeOutcomeModel.load(where), json.loads((where / "provenance.json").read_text())
    model, info = fit_out_of_sample_world_model(policy_tasks)
    info["source"] = "out-of-sample"
    model.save(where)
    (where / "provenance.json").write_text(json.dumps(info, indent=1))
    return model, info


def _one_arm(
    arm: str, seed: int, policy: Any, scaffold: Any, world_model: Any, config: SpeedupConfig,
    train_tasks: list[str], evaluate: Any, start_point: dict[str, Any] | None,
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:  # fmt: skip
    """Train one arm from the current weights under the budget: (row, history, guard events)."""
    from agents.grpo import ExploitationGuard, ShadowProbe, WorldModelUpdater, train
    from agents.llm.trainer import GRPOConfig, LLMAgent
    from benchmarks.speedup_accounting import OutcomeCache, ScriptCounter, distinct_scripts

    groups = 1 if arm == "real1" else config.groups_per_step
    probe_before = cpu_probe()  # outside the budget, like everything before the _Budget
    budget = _Budget(config, evaluate, dict(start_point) if start_point else None)
    cache = OutcomeCache() if config.outcome_cache else None
    counter = ScriptCounter(world_model)
    env = make_vector_env(
        "wmrl/AutoResearch-v0", groups * config.group_size, vectorization=config.vectorization, split="train",
        executor=cache, **config.env_kwargs(),
    )  # fmt: skip
    stack = build_stack(
        env, _ARM_STACK.get(arm, arm), counter, anchor_fraction=config.anchor_fraction,
        anchor_min_per_step=config.anchor_min_per_step, seed=seed, calibration=config.calibration(),
        anchor_selection={"wmrl": config.anchor_selection, "wmrl-informative": "informative"}.get(arm, "random"),
        anchor_keep_share=config.anchor_keep_share,
    )  # fmt: skip
    callbacks: list[Any] = [budget]
    updater = None
    if arm in ANCHORED_ARMS and config.wm_update_every:
        updater = WorldModelUpdater(stack, every=config.wm_update_every, seed=seed)
        callbacks.insert(0, updater)  # before the budget: a refit is swapped in before an evaluation
    probe = shadow_env = None
    if arm in WORLD_MODEL_ARMS and config.shadow_every:
        # its own env and cache: a probed script must not become a free repeat for the arm
        shadow_env = gym.make("wmrl/AutoResearch-v0", split="train", executor=OutcomeCache(), **config.env_kwargs())
        probe = ShadowProbe(
            stack,
            every=config.shadow_every,
            sample=config.shadow_sample,
            seed=seed,
            grader=StackHandle(shadow_env).real_grader(),
        )
        budget.untimed.append(probe)
        callbacks.insert(0, probe)
    guard = None
    if arm in ANCHORED_ARMS and config.monitor_max_gap is not None:
        guard = ExploitationGuard(stack, max_gap=config.monitor_max_gap, action=config.monitor_action)
        callbacks.insert(0, guard)
    grpo = GRPOConfig(
        groups_per_step=groups, group_size=config.group_size, total_steps=config.max_steps,
        max_new_tokens=config.max_new_tokens, temperature=config.temperature, learning_rate=config.learning_rate,
        micro_batch_size=config.micro_batch_size, seed=seed, progress=False, tensorboard=False,
        # the arms run the paper's recipe: a guard that changes the anchor share only when asked for
        exploitation_guard=False, max_rollbacks=config.max_rollbacks, warmup_steps=config.warmup_steps,
        beta=config.beta,
    )  # fmt: skip
    try:
        history = train(LLMAgent(policy, stack, scaffold, grpo, tasks=train_tasks), callbacks=callbacks).history
    finally:
        if updater is not None:  # a refit still running must not spend the next arm's CPU
            updater.wait()
        if shadow_env is not None:
            shadow_env.close()
        stack.close()
    if budget.pending:  # stopped early (guard): the remaining points are the final state
        budget.measure(len(history))
    row = _arm_row(arm, seed, history, budget, config, groups)
    row["cpu_probe_s"] = [probe_before, cpu_probe()]  # the machine's speed before / after the arm
    per_task = distinct_scripts(counter.scripts, cache.scripts if cache else {})
    row["distinct_scripts_per_task"] = float(np.mean(list(per_task.values()))) if per_task else 0.0
    row["distinct_scripts"] = per_task
    if probe is not None:
        row["shadow"] = {"summary": probe.summary(), "records": probe.records}
    if updater is not None:
        row["wm_updates"] = {"fit_cpu_s": updater.fit_seconds, "history": updater.history, "final": updater.fidelity()}
    row["cache_hits"] = cache.hits if cache else 0
    row["cache_runs"] = cache.runs if cache else None
    return row, history, guard.events if guard else []


def _policy_tasks(config: SpeedupConfig) -> tuple[list[str], list[str]]:
    """The policy's training and held-out task ids; their landmarks computed in this process.

    Fair accounting: every grading context carries the tasks' landmarks (cached per process),
    so they are computed here, before any arm's clock starts, instead of by whichever arm grades
    first."""
    from wmrl_envs.autoresearch.landmarks import task_landmarks
    from wmrl_envs.autoresearch.tasks import get_task, list_catalog

    train_tasks = list(config.train_tasks or list_catalog("train", tier=config.tier))
    eval_tasks = list(config.eval_tasks or list_catalog("test", tier=config.tier))[: config.eval_max_tasks or None]
    for task_id in dict.fromkeys(train_tasks + eval_tasks):
        task_landmarks(get_task(task_id))
    return train_tasks, eval_tasks


def _seed_policy(config: SpeedupConfig, seed: int, train_tasks: list[str], scaffold: Any, saved: Path) -> Any:
    """The seed's starting policy, the same for every arm. The warm start is untimed; on the
    rich scaffold it takes minutes, so it is kept beside the arms (a cache, not a result) and a
    resumed run loads it."""
    import torch

    policy = load_policy(config.policy, seed=seed)
    warm_file = saved / f"warm-start-seed{seed}.pt"
    if config.warm_start_steps and warm_file.is_file():
        policy.load_trainable_state_dict(torch.load(warm_file))
    elif config.warm_start_steps:
        partial = saved / f"warm-start-seed{seed}.partial.pt"  # SmolLM2 on scripts takes hours
        warm_start_plans(
            policy, train_tasks, steps=config.warm_start_steps, learning_rate=config.warm_start_lr, seed=seed,
            scaffold=scaffold, batch_size=config.warm_start_batch_size, checkpoint=partial,
        )  # fmt: skip
        torch.save(policy.trainable_state_dict(), warm_file)
        partial.unlink()  # its optimiser state is not needed once the warm start is kept
    return policy


def _train_and_save(
    arm: str, seed: int, policy: Any, scaffold: Any, world_model: Any, config: SpeedupConfig,
    train_tasks: list[str], evaluate: Any, start_point: dict[str, Any] | None, saved: Path,
) -> None:  # fmt: skip
    """Train one arm from the policy's current weights and save it under ``saved``."""
    import torch

    row, history, events = _one_arm(
        arm, seed, policy, scaffold, world_model, config, train_tasks, evaluate, start_point
    )
    _save_arm(saved, arm, seed, {"row": row, "history": history, "guard_events": events})
    if config.save_policies:
        torch.save(policy.trainable_state_dict(), saved / f"{arm}-seed{seed}.pt")


def _arm_worker(
    config: SpeedupConfig, run_dir: Path, arm: str, seed: int, initial: Mapping[str, Any]
) -> tuple[int, int]:
    """One arm x seed in a worker process (``workers`` > 1) from the seed's starting weights
    ``initial``: rebuilds what :func:`run` set up (the landmarks, the world model saved in the
    run directory, the start point), trains and saves the arm. Returns its held-out memo's
    (real runs, repeats served)."""
    import torch

    from agents.llm.scaffolds import make_scaffold

    torch.set_num_threads(config.threads)
    train_tasks, eval_tasks = _policy_tasks(config)
    world_model, _ = _world_model(config, train_tasks + eval_tasks, run_dir)
    scaffold = make_scaffold(config.scaffold)
    saved = run_dir / "arms"
    policy = load_policy(config.policy, seed=seed)
    policy.load_trainable_state_dict(initial)
    policy.sync_backend()
    memo = OutcomeCache()
    start_file = saved / f"start-seed{seed}.json"
    start_point = json.loads(start_file.read_text()) if start_file.is_file() else None

    def evaluate() -> dict[str, Any]:
        return _evaluate(policy, scaffold, eval_tasks, config, seed, memo)

    _train_and_save(arm, seed, policy, scaffold, world_model, config, train_tasks, evaluate, start_point, saved)
    return memo.runs, memo.hits


def run(config: SpeedupConfig, run_dir: Path, *, progress: bool = True) -> dict[str, Any]:
    """Every arm x seed under the budget; writes ``results.json``, ``results.md``,
    ``summary.json``, ``heldout_vs_cost.png`` and ``monitor.png`` into ``run_dir``. Each
    finished arm x seed is saved under ``run_dir/arms/``; a rerun into the same directory
    continues where it stopped. With ``workers`` > 1 a seed's arms train side by side in
    worker processes."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    import torch

    from agents.llm.scaffolds import make_scaffold

    torch.set_num_threads(config.threads)
    started = time.perf_counter()
    load_start = os.getloadavg()
    train_tasks, eval_tasks = _policy_tasks(config)
    world_model, wm_info = _world_model(config, train_tasks + eval_tasks, run_dir)
    scaffold = make_scaffold(config.scaffold)
    memo = OutcomeCache()  # held-out evaluation's own cache (untimed; training never uses it)
    memo_counts = [0, 0]  # real runs, repeats served: of this process's memo and the workers'
    saved = run_dir / "arms"
    saved.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=len(config.seeds) * len(config.arms), desc="speedup", disable=not progress)
    for seed in config.seeds:
        todo = [a for a in config.arms if _arm_file(saved, a, seed) is None]
        bar.update(len(config.arms) - len(todo))
        if not todo:
            continue
        policy = _seed_policy(config, seed, train_tasks, scaffold, saved)
        initial = policy.trainable_state_dict()

        def evaluate() -> dict[str, Any]:
            return _evaluate(policy, scaffold, eval_tasks, config, seed, memo)  # noqa: B023

        start_file = saved / f"start-seed{seed}.json"
        start_point: dict[str, Any] | None = None
        if config.eval_fractions[0] == 0.0:
            if start_file.is_file():
                start_point = json.loads(start_file.read_text())
            else:
                start_point = evaluate()  # same weights and seed for every arm: measured once
                start_file.write_text(json.dumps(start_point))
        if config.workers > 1 and len(todo) > 1:
            # spawn, not fork: a forked torch process can deadlock on the parent's thread pools
            context = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(min(config.workers, len(todo)), mp_context=context) as pool:
                futures = {pool.submit(_arm_worker, config, run_dir, arm, seed, initial): arm for arm in todo}
                for future in as_completed(futures):
                    bar.set_postfix(seed=seed, finished=futures[future])
                    runs, hits = future.result()  # a failed arm raises here; finished arms stay saved
                    memo_counts[0] += runs
                    memo_counts[1] += hits
                    bar.update()
            continue
        for arm in todo:
            bar.set_postfix(seed=seed, arm=arm)
            policy.load_trainable_state_dict(initial)
            policy.sync_backend()
            _train_and_save(arm, seed, policy, scaffold, world_model, config, train_tasks, evaluate, start_point, saved)
            bar.update()
    bar.close()
    rows: list[dict[str, Any]] = []
    histories: dict[str, list[dict[str, Any]]] = {}
    guard_events: dict[str, list[dict[str, Any]]] = {}
    for seed in config.seeds:
        for arm in config.arms:
            done = _finished_arm(saved, arm, seed)
            assert done is not None, f"{arm}-seed{seed} was trained but not saved"
            rows.append(_saved_row(arm, done))
            histories[f"{arm}-seed{seed}"] = done["history"]
            guard_events[f"{arm}-seed{seed}"] = done["guard_events"]
    eval_memo = {"real_runs": memo.runs + memo_counts[0], "repeats_served": memo.hits + memo_counts[1]}
    return _finish(config, run_dir, rows, histories, guard_events, wm_info, eval_memo, train_tasks, eval_tasks,
                   started=started, load_start=load_start)  # fmt: skip


def _finish(
    config: SpeedupConfig, run_dir: Path, rows: list[dict[str, Any]], histories: dict[str, Any],
    guard_events: dict[str, Any], wm_info: dict[str, Any], eval_memo: dict[str, int], train_tasks: list[str],
    eval_tasks: list[str], *, started: float, load_start: tuple[float, float, float],
) -> dict[str, Any]:  # fmt: skip
    heads = []
    for seed in config.seeds:
        by_arm = {r["arm"]: r for r in rows if r["seed"] == seed}
        if "real" in by_arm and "wmrl" in by_arm:
            heads.append(headline(by_arm["real"], by_arm["wmrl"]))
    summary = build_summary(config, rows, wm_info)
    write_json(run_dir / "summary.json", summary)
    result = {
        "experiment": NAME,
        "config": config_to_dict(config),
        "machine": machine_summary(),
        "load_average": {"start": load_start, "end": os.getloadavg()},
        "total_wall_s": time.perf_counter() - started,
        "train_tasks": train_tasks,
        "eval_tasks": eval_tasks,
        "world_model": {k: v for k, v in wm_info.items()},
        "eval_memo": eval_memo,
        "arms": summarize_seeds(rows, "arm", ARM_METRICS),
        "summary": summary,
        "headline": heads,
        "headline_summary": summarize_seeds([{"arm": "wmrl", **h} for h in heads], "arm", RATIO_METRICS)
        if heads
        else [],
        "per_seed": [{k: v for k, v in r.items() if k != "curve"} for r in rows],
        "curves": {f"{r['arm']}-seed{r['seed']}": r["curve"] for r in rows},
        "guard_events": guard_events,
        # the per-step logs stay in arms/<arm>-seed<s>.json.gz (megabytes per arm x seed)
        "histories_in": "arms/<arm>-seed<seed>.json.gz",
    }
    plots = [str(_plot_curves(config, rows, run_dir / "heldout_vs_cost.png"))]
    if any(a in ANCHORED_ARMS for a in config.arms):
        plots.append(str(_plot_monitor(histories, config, run_dir / "monitor.png")))
    if any(r.get("shadow") for r in rows):
        plots.append(str(_plot_shadow(rows, run_dir / "shadow_gap.png")))
    if any((r.get("wm_updates") or {}).get("history") for r in rows):  # at least one refit to show
        plots.append(str(_plot_wm_updates(rows, run_dir / "wm_updates.png")))
    result["plots"] = plots
    return {**write_results(run_dir, result, tables(result)), "histories": histories}


def _save_arm(saved: Path, arm: str, seed: int, payload: Mapping[str, Any]) -> None:
    """One finished arm x seed, gzipped (its per-step history is megabytes of JSON)."""
    tmp = saved / f".{arm}-seed{seed}.json.gz.tmp"
    with gzip.open(tmp, "wt") as f:
        json.dump(payload, f, default=str)
    tmp.replace(saved / f"{arm}-seed{seed}.json.gz")  # atomic: a killed run leaves no half file


def _saved_row(arm: str, done: Mapping[str, Any]) -> dict[str, Any]:
    """A saved arm's summary row; arms saved before the anchor or format metrics existed get them
    from their history."""
    history = done["history"]
    return {**anchor_fields(arm, history, done["row"]["cost_cpu_s"]), **format_fields(history), **done["row"]}


def _arm_file(saved: Path, arm: str, seed: int) -> Path | None:
    """The saved arm x seed's file (``.json.gz``, or the plain ``.json`` of runs before), if finished."""
    for path in (saved / f"{arm}-seed{seed}.json.gz", saved / f"{arm}-seed{seed}.json"):
        if path.is_file():
            return path
    return None


def _finished_arm(saved: Path, arm: str, seed: int) -> dict[str, Any] | None:
    """The saved arm x seed, if finished."""
    path = _arm_file(saved, arm, seed)
    if path is None:
        return None
    if path.suffix == ".gz":
        with gzip.open(path, "rt") as f:
            return json.load(f)
    return json.loads(path.read_text())


def summary_from_arms(run_dir: Path) -> dict[str, Any]:
    """The summary of a run (``wmrl-bench speedup --run-dir RUN_DIR``: finished, stopped or
    still going) from its saved arms, over the seeds whose every arm finished; the world
    model's one-off cost is amortised over those seeds' runs. While some planned seed is
    unfinished it writes ``summary-partial.json`` (marked ``partial``) and
    ``heldout_vs_cost-partial.png`` (and, when the arms have them, ``shadow_gap-partial.png``
    and ``wm_updates-partial.png``) into ``run_dir``; once every planned seed is done,
    ``summary.json`` (unmarked, as the run writes it) and those plots without the suffix."""
    run_dir = Path(run_dir)
    saved = json.loads((run_dir / "config.json").read_text())
    planned = build_config(SpeedupConfig, {k: v for k, v in saved.items() if k not in ("experiment", "config_file")})
    rows: list[dict[str, Any]] = []
    complete: list[int] = []
    for seed in planned.seeds:
        finished = {arm: _finished_arm(run_dir / "arms", arm, seed) for arm in planned.arms}
        if any(done is None for done in finished.values()):
            continue
        complete.append(seed)
        rows += [_saved_row(arm, done) for arm, done in finished.items() if done is not None]
    if not complete:
        raise FileNotFoundError(f"no seed in {run_dir / 'arms'} has every arm ({', '.join(planned.arms)}) finished")
    config = replace(planned, seeds=tuple(complete))
    provenance = run_dir / "world_model" / "provenance.json"
    wm_info = json.loads(provenance.read_text()) if provenance.is_file() else {}
    summary = build_summary(config, rows, wm_info)
    suffix = ""
    if len(complete) < len(planned.seeds):
        suffix = "-partial"
        summary["partial"] = (
            f"PARTIAL: seeds {complete} of the planned {list(planned.seeds)}, from the saved arms "
            "(benchmarks.speedup.summary_from_arms); summary.json is written when every seed is done"
        )
    write_json(run_dir / f"summary{suffix}.json", summary)
    _plot_curves(config, rows, run_dir / f"heldout_vs_cost{suffix}.png")
    if any(r.get("shadow") for r in rows):
        _plot_shadow(rows, run_dir / f"shadow_gap{suffix}.png")
    if any((r.get("wm_updates") or {}).get("history") for r in rows):
        _plot_wm_updates(rows, run_dir / f"wm_updates{suffix}.png")
    return summary


#: the parts of an arm's charged CPU (``<part>_cpu_s`` in its row), in ``summary.json``'s ``cpu_share``
CPU_PARTS = ("gen", "real_grading", "wm_grading", "update", "other")


def build_summary(
    config: SpeedupConfig, rows: Sequence[Mapping[str, Any]], wm_info: Mapping[str, Any]
) -> dict[str, Any]:
    """The run's summary (``summary.json``): per arm, final held-out score and cost-to-reach
    ratios vs the real arm at measured points, each a mean over seeds with a bootstrap 95% CI
    and the number of seeds that reached; the shares of its CPU (``cpu_share``) and its steps
    per real-arm step (``steps_vs_real``); for the anchored arms, what the anchors bought and
    each seed's ``anchor_weight_trajectory``; plus the world model's fit set, its overlap with
    the policy's tasks and its one-off cost."""
    one_off = (wm_info.get("fit_cpu_s") or 0.0) + (wm_info.get("fit_logged_cpu_s") or 0.0)
    wm_arms = [a for a in config.arms if a in WORLD_MODEL_ARMS]
    per_run = one_off / max(1, len(config.seeds) * len(wm_arms))  # amortised over the run's world-model arm runs
    real = {r["seed"]: r for r in rows if r["arm"] == "real"}
    arms: dict[str, Any] = {}
    for arm in config.arms:
        mine = [r for r in rows if r["arm"] == arm]
        finals = [r["final_heldout"] for r in mine]
        entry: dict[str, Any] = {
            "seeds": [r["seed"] for r in mine],
            "final_heldout_mean": _mean(finals),
            "final_heldout_ci95": bootstrap_ci(finals),
            "cpu_s": _mean([r["cost_cpu_s"] for r in mine]),
            "steps": _mean([r["steps"] for r in mine]),
            "cache_hits": _mean([r.get("cache_hits") for r in mine]),
            "distinct_scripts_per_task": _mean([r.get("distinct_scripts_per_task") for r in mine]),
            # a run collapsed off the format scores 0 from then on: say how much of each arm was
            "collapsed_step_share": _mean([r.get("collapsed_step_share") for r in mine]),
            "collapsed_step_share_ci95": bootstrap_ci([r.get("collapsed_step_share") for r in mine]),
            "rollbacks": _mean([r.get("rollbacks") for r in mine]),
            # where the budget went: a reward that costs nothing can only buy back its own share
            "cpu_share": {
                part: _mean([r[f"{part}_cpu_s"] / r["cost_cpu_s"] for r in mine if r.get(f"{part}_cpu_s") is not None])
                for part in CPU_PARTS
            },
        }
        if arm != "real" and real:
            # "more optimizer steps per CPU-second": the speedup a cheaper reward alone would give
            # if a step against it taught as much as a step against real execution
            steps_ratios = [r["steps"] / real[r["seed"]]["steps"] for r in mine if real.get(r["seed"], {}).get("steps")]
            entry["steps_vs_real"], entry["steps_vs_real_ci95"] = _mean(steps_ratios), bootstrap_ci(steps_ratios)
            ratios = [
                reach_ratios(real[r["seed"]]["curve"], r["curve"], per_run if arm in wm_arms else 0.0)
                for r in mine
                if r["seed"] in real
            ]
            entry.update(_ratio_entries("reach_", ratios))
        # recomputed from the saved probes, so arms saved by an older summariser read alike
        shadows = [
            summarize_probes(r["shadow"]["records"], cpu_s=r["shadow"]["summary"].get("cpu_s", 0.0))
            for r in mine
            if r.get("shadow")
        ]
        if shadows:
            entry["shadow"] = {
                key: {"mean": _mean([x[key] for x in shadows]), "ci95": bootstrap_ci([x[key] for x in shadows])}
                for key in SHADOW_METRICS
            }
        if arm in ANCHORED_ARMS:
            for key in ANCHOR_METRICS:
                values = [r.get(key) for r in mine]
                entry[key], entry[key + "_ci95"] = _mean(values), bootstrap_ci(values)
            reasons = [r["uninformative_anchor_reasons"] for r in mine if r.get("uninformative_anchor_reasons")]
            if reasons:  # runs recorded before the monitor counted them have none
                entry["uninformative_anchor_reasons"] = {
                    reason: {"mean": _mean([x[reason] for x in reasons]), "ci95": bootstrap_ci([x[reason] for x in reasons]),
                             "seeds": len(reasons)}
                    for reason in UNINFORMATIVE_REASONS
                }  # fmt: skip
            # a mean weight hides when denoising engaged: keep each seed's [step, weight, se] changes
            entry["anchor_weight_trajectory"] = {str(r["seed"]): r.get("anchor_weight_trajectory") for r in mine}
            # against the raw world model's own curve: do the corrections buy anything? (both
            # arms use the same world model, so no one-off cost is added to either)
            raw = {r["seed"]: r for r in rows if r["arm"] == "wm"}
            if raw:
                versus = [reach_ratios(raw[r["seed"]]["curve"], r["curve"]) for r in mine if r["seed"] in raw]
                entry.update(_ratio_entries("reach_vs_wm_", versus))
        arms[arm] = entry
    return {
        "seeds": list(config.seeds),
        "tier": config.tier,
        "budget_cpu_s": config.budget_cpu_s,
        "wm_source": wm_info.get("source"),
        "wm_fit_tasks": wm_info.get("fit_tasks"),
        "wm_fit_overlap": wm_info.get("overlap"),
        "wm_one_off_cost": {
            "fit_cpu_s": wm_info.get("fit_cpu_s"),
            "fit_logged_cpu_s": wm_info.get("fit_logged_cpu_s"),
            "per_world_model_arm_run_cpu_s": per_run,
        },
        "distinct_scripts_per_task": {a: arms[a]["distinct_scripts_per_task"] for a in arms},
        "arms": arms,
    }


def _ratio_entries(prefix: str, ratios: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Mean, bootstrap CI and seeds reached of each cost-to-reach ratio over seeds."""
    entry: dict[str, Any] = {}
    for key in ("ratio_final", "ratio_95gain", "ratio_final_amortized", "ratio_95gain_amortized"):
        values = [x[key] for x in ratios]
        entry[prefix + key] = _mean(values)
        entry[prefix + key + "_ci95"] = bootstrap_ci(values)
        entry[prefix + key + "_seeds_reached"] = sum(v is not None for v in values)
    return entry


def _mean(values: Sequence[Any]) -> float | None:
    known = [float(v) for v in values if v is not None]
    return float(np.mean(known)) if known else None


# ------------------------------------------------------------------ tables and plots
def _pm(row: Mapping[str, Any], key: str, digits: int = 3) -> str | None:
    mean, sd = row.get(key), row.get(f"{key}_sd")
    if mean is None:
        return None
    text = f"{mean:.{digits}g}" if abs(mean) < 1000 else f"{mean:,.0f}"
    return text if not sd else f"{text} ± {sd:.2g}"


def tables(result: Mapping[str, Any]) -> str:
    """The Markdown tables of a speedup result (mean ± sample sd over seeds)."""
    cfg = result["config"]
    k = cfg["eval_k"]
    arm_rows = [
        {
            "arm": r["arm"], "seeds": r["seeds"], "budget CPU s": _pm(r, "cost_cpu_s"), "wall s": _pm(r, "wall_s"),
            "steps": _pm(r, "steps"), "CPU s / step": _pm(r, "step_cpu_s"), "gen CPU s": _pm(r, "gen_cpu_s"),
            "real grading CPU s": _pm(r, "real_grading_cpu_s"), "WM grading CPU s": _pm(r, "wm_grading_cpu_s"),
            "update CPU s": _pm(r, "update_cpu_s"), "real executions": _pm(r, "real_executions"),
            "anchor share": _pm(r, "anchor_share"), f"final held-out avg@{k}": _pm(r, "final_heldout"),
            f"best held-out avg@{k}": _pm(r, "best_heldout"), "WM gap (anchors)": _pm(r, "monitor_gap"),
            "WM rank agreement": _pm(r, "monitor_rank_agreement"), "anchor CPU share": _pm(r, "anchor_cpu_share"),
            "informative anchor groups": _pm(r, "informative_anchor_share"),
            "anchor weight (mean over steps)": _pm(r, "anchor_weight_mean"),
            "collapsed steps": _pm(r, "collapsed_step_share"), "rollbacks": _pm(r, "rollbacks"),
        }
        for r in result["arms"]
    ]  # fmt: skip
    parts = [markdown_table(arm_rows)]
    summary = result.get("summary")
    if summary:
        parts.append(_summary_table(summary, k))
    if result["headline"]:
        head_rows = [
            {
                "seed": h["seed"], "real arm reaches its final score at CPU s": _fmt(h.get("real_reach_cost")),
                "WMRL first reaches it at CPU s": _fmt(h.get("wmrl_reach_cost")), "cost-to-reach ratio": _fmt(h.get("reach_ratio")),
                "ideal ratio (component costs)": _fmt(h.get("ideal_ratio")), "note": h.get("note", ""),
            }
            for h in result["headline"]
        ]  # fmt: skip
        parts.append(markdown_table(head_rows))
        s = result["headline_summary"][0] if result["headline_summary"] else {}
        parts.append(
            f"**Headline**: cost-to-reach ratio (real / WMRL) {_pm(s, 'reach_ratio') or 'undefined or not reached (see notes)'} "
            f"over {len([h for h in result['headline'] if h.get('reach_ratio') is not None])} of {len(result['headline'])} seeds; "
            f"ideal ratio from the measured component costs {_pm(s, 'ideal_ratio')}."
        )
    curve_rows = []
    for name, curve in result["curves"].items():
        for p in curve:
            curve_rows.append(
                {
                    "arm-seed": name,
                    "fraction": round(p["fraction"], 2),
                    "step": p["step"],
                    "CPU s": round(p["cost_cpu_s"], 1),
                    f"held-out avg@{k}": _fmt(p["heldout"]),
                    "valid rate": _fmt(p["valid_rate"]),
                }
            )
    parts.append(markdown_table(curve_rows))
    load = result["load_average"]
    parts.append(
        f"Tier `{cfg['tier']}`, budget {cfg['budget_cpu_s']:g} CPU-s per arm, {cfg['groups_per_step']} groups x {cfg['group_size']} per step, "
        f"anchor fraction {cfg['anchor_fraction']} (floor {cfg['anchor_min_per_step']}/step, "
        f"{cfg.get('anchor_selection', 'random')} selection), policy `{cfg['policy']}`. Held-out: "
        f"{', '.join(result['eval_tasks'])} (avg@{k}, real execution, untimed; {result['eval_memo']['real_runs']} real runs, "
        f"{result['eval_memo']['repeats_served']} repeated scripts served from their first run). Load average (1/5/15 min) at start "
        f"{tuple(round(x, 1) for x in load['start'])}, at end {tuple(round(x, 1) for x in load['end'])}; "
        f"{result['machine']['cpus']} CPUs; total {result['total_wall_s']:.0f} s."
    )
    probes = [f"{r['arm']}-seed{r['seed']} {r['cpu_probe_s'][0]:.2f} / {r['cpu_probe_s'][1]:.2f}"
              for r in result["per_seed"] if r.get("cpu_probe_s")]  # fmt: skip
    if probes:  # arms saved before the probe existed have none
        parts.append(
            "CPU probe (CPU-s of one fixed piece of work before / after each arm; the same work taking "
            f"longer means a slower machine, so fewer steps for the same budget): {'; '.join(probes)}."
        )
    return "\n\n".join(parts)


def _ci(mean: Any, ci: Any) -> str:
    if mean is None:
        return "—"
    return f"{mean:.3g}" + (f" [{ci[0]:.3g}, {ci[1]:.3g}]" if ci else "")


def _summary_table(summary: Mapping[str, Any], k: int) -> str:
    """Per arm: means over seeds with bootstrap 95% CIs; ratios at measured eval points."""
    rows = []
    for arm, a in summary["arms"].items():
        row = {
            "arm": arm,
            f"final held-out avg@{k} [95% CI]": _ci(a["final_heldout_mean"], a["final_heldout_ci95"]),
            "CPU s": _fmt(a["cpu_s"]),
            "steps": _fmt(a["steps"]),
            "cache hits": _fmt(a["cache_hits"]),
            "distinct scripts / task": _fmt(a["distinct_scripts_per_task"]),
            "collapsed steps [95% CI]": _ci(a.get("collapsed_step_share"), a.get("collapsed_step_share_ci95")),
        }
        if "reach_ratio_final" in a:
            n = len(a["seeds"])
            row["ratio to real's final [95% CI] (seeds reached)"] = (
                f"{_ci(a['reach_ratio_final'], a['reach_ratio_final_ci95'])} ({a['reach_ratio_final_seeds_reached']}/{n})"
            )
            row["ratio to 95% of real's gain (seeds reached)"] = (
                f"{_ci(a['reach_ratio_95gain'], a['reach_ratio_95gain_ci95'])} ({a['reach_ratio_95gain_seeds_reached']}/{n})"
            )
            row["same, WM one-off cost amortised"] = _ci(
                a["reach_ratio_final_amortized"], a["reach_ratio_final_amortized_ci95"]
            )
        if "reach_vs_wm_ratio_final" in a:
            row["ratio to raw WM arm's final (seeds reached)"] = (
                f"{_ci(a['reach_vs_wm_ratio_final'], a['reach_vs_wm_ratio_final_ci95'])} "
                f"({a['reach_vs_wm_ratio_final_seeds_reached']}/{len(a['seeds'])})"
            )
        rows.append(row)
    cost = summary["wm_one_off_cost"]
    note = (
        f"World model: `{summary['wm_source']}`, fitted on {len(summary['wm_fit_tasks'] or [])} tasks; overlap with the "
        f"policy's train + held-out tasks: {summary['wm_fit_overlap']}; one-off cost: fit "
        f"{_fmt(cost['fit_cpu_s'])} CPU-s + {_fmt(cost['fit_logged_cpu_s'])} logged CPU-s of the executions it learned "
        f"from ({_fmt(cost['per_world_model_arm_run_cpu_s'])} CPU-s per world-model arm run when amortised over this run). "
        "Ratios: real arm's cost / the arm's cost to first reach the target at a measured evaluation point."
    )
    columns = list(dict.fromkeys(k for row in rows for k in row))  # the real arm has no ratio columns
    return markdown_table(rows, columns) + "\n\n" + note


def _fmt(x: Any) -> str:
    return "—" if x is None else f"{x:.3g}"


_COLORS = {
    "real": "tab:red",
    "real1": "tab:orange",
    "wm": "tab:grey",
    "wmrl": "tab:blue",
    "wmrl-informative": "tab:green",
}
_STYLES = {"real": "-", "real1": "-.", "wm": ":", "wmrl": "--", "wmrl-informative": "--"}


def _bootstrap_band(stack: np.ndarray, n_boot: int = 2000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Pointwise bootstrap 95% band of the mean over seeds (rows of ``stack``; NaN skipped)."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(stack), size=(n_boot, len(stack)))
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # grid points past every seed's budget are all-NaN
        means = np.nanmean(stack[idx], axis=1)
        return np.nanquantile(means, 0.025, axis=0), np.nanquantile(means, 0.975, axis=0)


def _plot_curves(config: SpeedupConfig, rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Held-out score vs CPU cost per arm: the mean over seeds on a common grid, with the
    bootstrap 95% band of that mean."""
    fig, ax = new_figure(7.5, 4.2)
    grid = np.linspace(0, config.budget_cpu_s, 41)
    all_y: list[float] = []
    for arm in config.arms:
        curves = []
        for r in rows:
            if r["arm"] != arm:
                continue
            pts = [(p["cost_cpu_s"], p["heldout"]) for p in r["curve"] if p["heldout"] is not None]
            if pts:
                xs, ys = zip(*pts)
                curves.append(np.interp(grid, xs, ys, right=np.nan))
                ax.plot(xs, ys, _STYLES[arm], color=_COLORS[arm], alpha=0.25, lw=0.8, marker=".")
                all_y += list(ys)
        if curves:
            stack = np.array(curves)
            ax.plot(
                grid,
                np.nanmean(stack, axis=0),
                _STYLES[arm],
                color=_COLORS[arm],
                lw=2,
                label=f"{arm} (mean of {len(curves)} seed(s))",
            )
            if len(curves) > 1:
                lo, hi = _bootstrap_band(stack)
                ax.fill_between(grid, lo, hi, color=_COLORS[arm], alpha=0.12)
    if all_y:
        pad = max(0.02, 0.1 * (max(all_y) - min(all_y)))
        ax.set_ylim(min(all_y) - pad, max(all_y) + pad)
    ax.set_xlabel("training cost, CPU-seconds (process + sandbox children)")
    ax.set_ylabel(f"held-out avg@{config.eval_k} (real execution)")
    ax.set_title(f"held-out score vs compute, tier '{config.tier}'")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    return save_figure(fig, path)


def _plot_shadow(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """The shadow probes: world-model score minus real score of the policy's own scripts over
    training, raw and calibrated, per arm x seed (exploitation shows as a rising raw gap)."""
    fig, axes = new_figure(10.0, 3.6, ncols=2)
    for r in rows:
        records = (r.get("shadow") or {}).get("records") or []
        for ax, key in zip(axes, ("raw_gap", "calibrated_gap")):
            pts = [(x["step"], x[key]) for x in records if x[key] is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", ms=3, lw=1, label=f"{r['arm']}-seed{r['seed']}")
    for ax, title in zip(axes, ("raw WM score - real score", "calibrated WM score - real score")):
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.set_title(f"shadow probes: {title}")
        ax.set_xlabel("training step")
    axes[1].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    return save_figure(fig, path)


def _plot_wm_updates(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Fidelity on the held-back anchor scripts of the WMRL arm at every refit: the updated
    world model against the one the run started with (same scripts). The mean absolute score
    error is there because a policy that settles on a few scripts leaves one or two held-back
    scripts per task, where a within-task Spearman is +-1 or undefined."""
    fig, axes = new_figure(14.0, 3.6, ncols=3)
    keys = ("status_accuracy", "spearman_within_task", "mae")
    for r in rows:
        history = (r.get("wm_updates") or {}).get("history") or []
        for ax, key in zip(axes, keys):
            for which, style in (("updated", "-"), ("initial", ":")):
                pts = [(h["step"], h[which].get(key)) for h in history if h[which].get(key) is not None]
                if pts:
                    ax.plot(*zip(*pts), ls=style, marker="o", ms=3, lw=1, label=f"seed{r['seed']} {which}")
    for ax, title in zip(axes, ("status accuracy", "within-task Spearman", "mean |score error|")):
        ax.set_title(f"held-back anchor scripts: {title}", fontsize=10)
        ax.set_xlabel("training step")
    axes[2].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    return save_figure(fig, path)


def _plot_monitor(histories: Mapping[str, Sequence[Mapping[str, Any]]], config: SpeedupConfig, path: Path) -> Path:
    """The exploitation monitor of the WMRL arm: gap and rank agreement per step, per seed."""
    fig, axes = new_figure(10.0, 3.6, ncols=2)
    for name, history in histories.items():
        if not name.startswith("wmrl-"):
            continue
        for ax, key in zip(axes, ("monitor/gap", "monitor/rank_agreement")):
            pts = [(h["step"], h[key]) for h in history if h.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", ms=3, lw=1, label=name)
    axes[0].axhline(0.0, color="grey", lw=0.8)
    if config.monitor_max_gap is not None:
        axes[0].axhline(config.monitor_max_gap, color="tab:red", ls="--", lw=0.8, label="max_gap")
    axes[0].set_title("calibrated WM score - real score (anchor groups)")
    axes[1].set_title("within-group rank agreement (Spearman)")
    for ax in axes:
        ax.set_xlabel("training step")
    axes[1].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    return save_figure(fig, path)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.speedup",
        description="summary of a speedup run (finished or not) from its saved arms",
    )
    parser.add_argument("run_dir", type=Path, help="the run's directory (wmrl-bench speedup --run-dir)")
    summary = summary_from_arms(parser.parse_args().run_dir)
    print(json.dumps({"seeds": summary["seeds"], "partial": summary.get("partial", False)}))
