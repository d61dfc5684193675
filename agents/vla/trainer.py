"""GRPO of a MiniVLA through a wrapped LIBERO-Long env stack (``real`` | ``wm`` | ``wmrl``).

The loop, CleanRL-style, per step:

1. pick ``groups_per_step`` initial states; announce the step's group ids to an
   ``AnchorWrapper`` if the stack has one (``begin_step``: anchor decisions, refit boundary);
2. roll out ``group_size`` episodes per group from the same initial state, each group with
   its own ``group_id`` (:func:`agents.vla.rollout.run_group`); rewards, sources and the
   anchor flag come from the final step's ``info`` (sparse success under ``real``, the
   progress world model's dense score under ``wm``, anchors + calibrated scores under
   ``wmrl``), and the anchor weight from the ``CalibrationWrapper`` after the rollout;
3. :func:`agents.grpo.group_advantages` over the episodes; every per-step row (observation,
   7 action tokens, behaviour log-probs) of an episode carries its advantage;
4. ``ppo_epochs`` passes of :func:`agents.grpo.grpo_loss` over (a subsample of) the rows,
   the recomputed log-probs under the same masked, temperature-scaled distribution as the
   sampling, so the first epoch's ratio is 1 and nothing is clipped.

Metrics (``metrics.jsonl``, TensorBoard) include the share of no-signal groups (all members'
rewards equal), true goal-reached rate (diagnostic: the simulator's own check, which the
env runs every step anyway), and per-component cost: ms per action, render ms per action,
env steps/s, update ms per row, world-model and real-grading seconds. Checkpoints hold the
policy, optimiser, RNG and the wrapper stack's state; ``resume`` continues a run.

Classes: :class:`VLAGRPOConfig`. Functions: :func:`train`.

Example (a MuJoCo simulation; see ``python -m agents.vla train --help``)::

    policy = MiniVLA.load("runs/vla/sft/checkpoint")
    env = build_stack(LiberoLongEnv(task_id=7, cameras=False, render_mode="rgb_array"), "wmrl", wm)
    history = train(policy, env, VLAGRPOConfig(total_steps=3, group_size=4, init_states=(0, 1)))
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents.grpo import LossAggregation, group_advantages, grpo_loss
from agents.vla.model import MiniVLA, collate
from agents.vla.rollout import RolloutTimes, VLAEpisode, run_group
from wrappers import (
    AnchorWrapper,
    CalibrationWrapper,
    WorldModelWrapper,
    find_layer,
    load_stack_state_dict,
    stack_state_dict,
)

__all__ = ["VLAGRPOConfig", "train", "update"]


@dataclass
class VLAGRPOConfig:
    """Settings of ``python -m agents.vla train`` (TRL names where the concept is the same).

    Attributes:
        total_steps: GRPO steps.
        groups_per_step: groups (initial states) per step.
        group_size: rollouts per group (the paper: 8).
        init_states: initial states groups are drawn from (the paper trains on 0-15).
        temperature: sampling temperature (the loss uses the same).
        learning_rate: AdamW learning rate.
        weight_decay: AdamW weight decay.
        ppo_epochs: optimisation passes over a step's rows.
        epsilon / epsilon_high: lower / upper clip range (``epsilon_high=None`` = ``epsilon``).
        beta: KL coefficient to the initial policy (0 = no reference model).
        scale_by_std: divide advantages by the group std (``False``: Dr.GRPO centring).
        aggregation: ``token-mean`` or ``seq-mean-token-mean`` (rows are sequences).
        rows_per_episode: per-step rows sampled per episode for the update (``None``: all).
        micro_batch_size: rows per forward / backward pass.
        max_grad_norm: gradient clipping norm.
        action_repeat: env steps each decision is held for (must match the SFT demos).
        image_size: side of the rendered camera views.
        output_dir: metrics, TensorBoard and ``checkpoint/`` (``None``: nothing written).
        checkpoint_every: steps between checkpoints (the last step always saves).
        seed: seed of group choice, sampling and row subsampling.
        tensorboard: write TensorBoard events.
        progress: show a progress bar.
    """

    total_steps: int = 2
    groups_per_step: int = 1
    group_size: int = 4
    init_states: tuple[int, ...] = tuple(range(16))
    temperature: float = 1.0
    learning_rate: float = 1e-5
    weight_decay: float = 0.0
    ppo_epochs: int = 1
    epsilon: float = 0.2
    epsilon_high: float | None = None
    beta: float = 0.0
    scale_by_std: bool = True
    aggregation: LossAggregation = "token-mean"
    rows_per_episode: int | None = 32
    micro_batch_size: int = 16
    max_grad_norm: float = 1.0
    action_repeat: int = 4
    image_size: int = 64
    output_dir: str | None = "runs/vla/grpo"
    checkpoint_every: int = 1
    seed: int = 0
    tensorboard: bool = True
    progress: bool = True

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 (GRPO compares members), got {self.group_size}")
        if not self.init_states:
            raise ValueError("init_states must not be empty")


def update(
    policy: MiniVLA,
    optimizer: torch.optim.Optimizer,
    episodes: list[VLAEpisode],
    advantages: list[float],
    config: VLAGRPOConfig,
    rng: np.random.Generator,
    reference: MiniVLA | None = None,
) -> dict[str, float]:
    """``ppo_epochs`` optimiser steps of the clipped loss over the episodes' rows."""
    rows: list[tuple[dict[str, Any], torch.Tensor, torch.Tensor, float, int]] = []
    for e, (ep, adv) in enumerate(zip(episodes, advantages)):
        n = len(ep.rows)
        keep = np.arange(n)
        if config.rows_per_episode is not None and n > config.rows_per_episode:
            keep = np.sort(rng.choice(n, config.rows_per_episode, replace=False))
        rows += [(ep.rows[i], ep.tokens[i], ep.logprobs[i], adv, e) for i in keep]
    if not rows:
        return {}
    total_tokens = float(len(rows) * rows[0][1].numel())
    metrics: dict[str, list[float]] = {}
    t0 = time.perf_counter()
    passes = 0
    for epoch in range(config.ppo_epochs):
        order = rng.permutation(len(rows))
        optimizer.zero_grad()
        for start in range(0, len(order), config.micro_batch_size):
            batch = [rows[i] for i in order[start : start + config.micro_batch_size]]
            obs = collate([b[0] for b in batch])
            tokens = torch.stack([b[1] for b in batch])
            old = torch.stack([b[2] for b in batch])
            adv_t = torch.tensor([b[3] for b in batch], dtype=torch.float32)
            logp, entropy = policy.token_logprobs(obs, tokens, config.temperature, with_entropy=True)
            ref = None
            if reference is not None:
                with torch.no_grad():
                    ref = reference.token_logprobs(obs, tokens, config.temperature)
            out = grpo_loss(
                logp,
                old,
                adv_t,
                torch.ones_like(logp),
                epsilon=config.epsilon,
                epsilon_high=config.epsilon_high,
                ref_logprobs=ref,
                beta=config.beta,
                entropy=entropy,
                aggregation=config.aggregation,
            )
            (out.loss * (tokens.numel() / total_tokens)).backward()
            passes += len(batch)
            for k, v in out.metrics.items():
                metrics.setdefault(f"loss/{k}", []).append(v)
                if epoch == 0 and k in ("clip_frac", "ratio_mean"):
                    metrics.setdefault(f"loss/{k}_epoch0", []).append(v)
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), config.max_grad_norm)
        optimizer.step()
        metrics.setdefault("loss/grad_norm", []).append(float(grad_norm))
    result = {k: float(np.mean(v)) for k, v in metrics.items()}
    result["update/rows"] = float(len(rows))
    result["time/update_ms_per_row"] = 1000 * (time.perf_counter() - t0) / max(1, passes)
    return result


def _rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def _save(
    out: Path,
    policy: MiniVLA,
    optimizer: torch.optim.Optimizer,
    env: Any,
    step: int,
    config: VLAGRPOConfig,
    extra: dict[str, Any],
) -> None:
    ckpt = out / "checkpoint"
    policy.save(ckpt)
    torch.save(optimizer.state_dict(), ckpt / "optimizer.pt")
    torch.save(_rng_state(), ckpt / "rng.pt")
    if find_layer(env, WorldModelWrapper) is not None:
        (ckpt / "wrappers.json").write_text(json.dumps(stack_state_dict(env), default=str))
    (ckpt / "trainer.json").write_text(json.dumps({"step": step, "config": asdict(config), **extra}, default=str))


def _mean(xs: list[float]) -> float | None:
    return float(np.mean(xs)) if xs else None


def train(
    policy: MiniVLA,
    env: Any,
    config: VLAGRPOConfig | None = None,
    *,
    resume: bool = False,
    run_info: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """GRPO on ``env`` (a single LIBERO env stack); returns the per-step metrics."""
    config = config or VLAGRPOConfig()
    random.seed(config.seed)
    np.random.seed(config.seed)
    torch.manual_seed(config.seed)
    out = Path(config.output_dir) if config.output_dir else None
    optimizer = torch.optim.AdamW(policy.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    start = 0
    if resume and out is not None and (out / "checkpoint" / "trainer.json").is_file():
        ckpt = out / "checkpoint"
        policy.load_state_dict(torch.load(ckpt / "model.pt", weights_only=True))
        optimizer.load_state_dict(torch.load(ckpt / "optimizer.pt", weights_only=True))
        state = torch.load(ckpt / "rng.pt", weights_only=False)
        random.setstate(state["python"])
        np.random.set_state(state["numpy"])
        torch.set_rng_state(state["torch"])
        if (ckpt / "wrappers.json").is_file():
            load_stack_state_dict(env, json.loads((ckpt / "wrappers.json").read_text()))
        start = int(json.loads((ckpt / "trainer.json").read_text())["step"])
    reference = None
    if config.beta > 0:
        reference = MiniVLA(policy.config, policy.statistics)
        reference.load_state_dict(policy.state_dict())
        reference.eval()
    anchor_layer = find_layer(env, AnchorWrapper)
    wm_layer = find_layer(env, WorldModelWrapper)
    calibration_layer = find_layer(env, CalibrationWrapper)
    jsonl = tb = None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        jsonl = open(out / "metrics.jsonl", "a")
        if config.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            tb = SummaryWriter(str(out / "tb"))
    from tqdm.auto import tqdm

    history: list[dict[str, Any]] = []
    bar = tqdm(
        range(start, config.total_steps),
        initial=start,
        total=config.total_steps,
        desc="VLA GRPO",
        disable=not config.progress,
    )
    try:
        for step in bar:
            t_step = time.perf_counter()
            rng = np.random.default_rng([config.seed, step])
            gen = torch.Generator().manual_seed(int(rng.integers(2**31)))
            inits = rng.choice(
                list(config.init_states),
                size=config.groups_per_step,
                replace=len(config.init_states) < config.groups_per_step,
            )
            groups = [(f"s{step}-g{j}", int(k)) for j, k in enumerate(inits)]
            if anchor_layer is not None:
                anchor_layer.begin_step([g for g, _ in groups])
            counters_before = wm_layer.counters.to_dict() if wm_layer is not None else None
            times = RolloutTimes()
            policy.eval()
            episodes: list[VLAEpisode] = []
            for gid, init in groups:
                episodes += run_group(
                    env,
                    policy,
                    gid,
                    init,
                    config.group_size,
                    temperature=config.temperature,
                    generator=gen,
                    times=times,
                    action_repeat=config.action_repeat,
                    image_size=config.image_size,
                )
            anchor_weight = calibration_layer.anchor_weight if calibration_layer is not None else 1.0
            adv = group_advantages(
                [e.reward for e in episodes],
                [e.group_id for e in episodes],
                sources=[e.source for e in episodes],
                anchor_weight=anchor_weight,
                scale_by_std=config.scale_by_std,
            )
            used = [(e, a) for e, a in zip(episodes, adv.advantages) if a is not None and a != 0.0]
            policy.train()
            loss_metrics = (
                update(policy, optimizer, [e for e, _ in used], [a for _, a in used], config, rng, reference)
                if used
                else {}
            )
            s = adv.stats
            metrics: dict[str, Any] = {
                "reward/mean": _mean([e.reward for e in episodes if e.reward is not None]),
                "reward/env": _mean([e.reward for e in episodes if e.reward is not None and e.source == "env"]),
                "reward/wm": _mean([e.reward for e in episodes if e.reward is not None and e.source == "wm"]),
                "success/goal_reached": _mean([float(e.goal_reached) for e in episodes]),
                "success/graded": _mean([float(bool(e.success)) for e in episodes if e.success is not None]),
                "groups/used": s.groups_used,
                "groups/degenerate": s.groups_degenerate,
                "groups/no_signal_share": s.groups_degenerate / s.groups_used if s.groups_used else None,
                "groups/skipped": s.groups_skipped,
                "groups/anchor": s.anchor_groups,
                "anchor/weight": anchor_weight,
                "episodes/steps_mean": _mean([float(e.steps) for e in episodes]),
                "episodes/rows": sum(len(e.rows) for e in episodes),
                **times.summary(),
                **loss_metrics,
                "time/step_wall": time.perf_counter() - t_step,
            }
            if wm_layer is not None and counters_before is not None:
                now = wm_layer.counters.to_dict()
                metrics["real_executions/step"] = now["real_executions"] - counters_before["real_executions"]
                metrics["time/real_grading_s"] = now["real_seconds"] - counters_before["real_seconds"]
                metrics["time/wm_grading_s"] = now["wm_seconds"] - counters_before["wm_seconds"]
            else:
                metrics["real_executions/step"] = len(episodes)
            if calibration_layer is not None:
                last = episodes[-1].final_info
                metrics["calibration/fitted"] = last.get("calibrated")
                metrics["calibration/anchor_pairs_total"] = last.get("anchor_pairs_total")
            history.append({"step": step + 1, **metrics})
            if jsonl is not None:
                jsonl.write(json.dumps({"step": step + 1, **metrics}, default=str) + "\n")
                jsonl.flush()
            if tb is not None:
                for k, v in metrics.items():
                    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                        tb.add_scalar(k, v, step + 1)
            bar.set_postfix(reward=metrics["reward/mean"], goal=metrics["success/goal_reached"])
            if out is not None and ((step + 1) % config.checkpoint_every == 0 or step + 1 == config.total_steps):
                _save(out, policy, optimizer, env, step + 1, config, {"setup": run_info or {}})
    finally:
        bar.close()
        if jsonl is not None:
            jsonl.close()
        if tb is not None:
            tb.close()
    return history
