"""The VLA half of GRPO: a :class:`VLAAgent` for the shared loop (:func:`agents.grpo.train`)
on a wrapped LIBERO-Long env stack (``real`` | ``wm`` | ``wmrl``).

Per step (the loop in :mod:`agents.grpo.loop` does the rest):

1. :meth:`VLAAgent.select`: the rollout's sampling seed, then ``groups_per_step`` initial
   states from ``init_states``, each group with its own id;
2. :meth:`VLAAgent.collect`: ``group_size`` episodes per group from the same initial state
   (:func:`agents.vla.rollout.run_group`); rewards, sources and the anchor flag come from the
   final step's ``info`` (sparse success under ``real``, the progress world model's dense
   score under ``wm``, anchors + calibrated scores under ``wmrl``);
3. :meth:`VLAAgent.update`: every per-step row (observation, 7 action tokens, behaviour
   log-probs) of an episode carries its advantage; ``ppo_epochs`` passes of
   :func:`agents.grpo.grpo_loss` over (a subsample of) the rows, the recomputed log-probs
   under the same masked, temperature-scaled distribution as the sampling, so the first
   epoch's ratio is 1 and nothing is clipped.

Metrics include the true goal-reached rate (diagnostic: the simulator's own check, which the
env runs every step anyway) and per-component cost: ms per action, render ms per action, env
steps/s, update ms per row.

Classes: :class:`VLAGRPOConfig`, :class:`VLAAgent`. Functions: :func:`update`.

Example (a MuJoCo simulation; see ``python -m agents.vla train --help``)::

    policy = MiniVLA.load("runs/vla/sft/checkpoint")
    env = build_stack(LiberoLongEnv(task_id=7, cameras=False, render_mode="rgb_array"), "wmrl", wm)
    config = VLAGRPOConfig(total_steps=3, group_size=4, init_states=(0, 1))
    history = train(VLAAgent(policy, env, config)).history
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents.grpo import GRPOLoopConfig, grpo_loss
from agents.vla.model import MiniVLA, collate
from agents.vla.rollout import RolloutTimes, VLAEpisode, run_group

__all__ = ["VLAGRPOConfig", "VLAAgent", "update"]


@dataclass
class VLAGRPOConfig(GRPOLoopConfig):
    """Settings of ``python -m agents.vla train``: :class:`~agents.grpo.GRPOLoopConfig` with
    VLA-sized defaults (2 steps of 1 group of 4, micro-batches of 16 rows, a checkpoint every
    step into ``runs/vla/grpo``) plus

    Attributes:
        init_states: initial states groups are drawn from (the paper trains on 0-15).
        rows_per_episode: per-step rows sampled per episode for the update (``None``: all).
        action_repeat: env steps each decision is held for (must match the SFT demos).
        image_size: side of the rendered camera views.
        entropy_coef: entropy bonus. Default 0.0.

    ``loss_aggregation``: rows are the sequences of ``seq-mean-token-mean``.
    """

    total_steps: int = 2
    groups_per_step: int = 1
    micro_batch_size: int = 16
    output_dir: str | None = "runs/vla/grpo"
    checkpoint_every: int = 1
    init_states: tuple[int, ...] = tuple(range(16))
    rows_per_episode: int | None = 32
    action_repeat: int = 4
    image_size: int = 64
    entropy_coef: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 (GRPO compares members), got {self.group_size}")
        if not self.init_states:
            raise ValueError("init_states must not be empty")


class VLAAgent:
    """A MiniVLA acting in a (single) LIBERO env stack (a :class:`~agents.grpo.GRPOAgent`).

    Args:
        policy: the :class:`~agents.vla.model.MiniVLA` to train in place.
        env: the env stack (one env: a LIBERO scene costs ~2 GB per copy).
        config: :class:`VLAGRPOConfig`.
    """

    def __init__(self, policy: MiniVLA, env: Any, config: VLAGRPOConfig | None = None) -> None:
        self.policy, self.env = policy, env
        self.config = config or VLAGRPOConfig()
        # The KL anchor: a frozen copy of the starting policy (a deep copy draws no random numbers).
        self.reference = copy.deepcopy(policy).eval() if self.config.beta > 0 else None
        self._generator: torch.Generator | None = None

    def parameters(self) -> Any:
        return self.policy.parameters()

    def select(self, step: int, rng: np.random.Generator) -> list[tuple[str, Any]]:
        # The sampling seed is drawn before the initial states (this trainer's order since its
        # first version, so seeded runs reproduce).
        self._generator = torch.Generator().manual_seed(int(rng.integers(2**31)))
        states = list(self.config.init_states)
        n = self.config.groups_per_step
        inits = rng.choice(states, size=n, replace=len(states) < n)
        return [(f"s{step}-g{j}", int(k)) for j, k in enumerate(inits)]

    def collect(
        self, groups: Sequence[tuple[str, Any]], rng: np.random.Generator
    ) -> tuple[list[VLAEpisode], dict[str, Any]]:
        c, times = self.config, RolloutTimes()
        self.policy.eval()
        episodes: list[VLAEpisode] = []
        for group_id, init in groups:
            episodes += run_group(
                self.env,
                self.policy,
                group_id,
                init,
                c.group_size,
                temperature=c.temperature,
                generator=self._generator,
                times=times,
                action_repeat=c.action_repeat,
                image_size=c.image_size,
            )
        return episodes, times.summary()

    def update(
        self,
        episodes: Sequence[VLAEpisode],
        advantages: Sequence[float],
        optimizer: torch.optim.Optimizer,
        rng: np.random.Generator,
    ) -> dict[str, float]:
        self.policy.train()
        return update(self.policy, optimizer, list(episodes), list(advantages), self.config, rng, self.reference)

    def step_metrics(self, episodes: Sequence[VLAEpisode]) -> dict[str, Any]:
        """Goal-reached and graded success rates, steps and rows per episode."""
        return {
            "success/goal_reached": _mean([float(e.goal_reached) for e in episodes]),
            "success/graded": _mean([float(bool(e.success)) for e in episodes if e.success is not None]),
            "episodes/steps_mean": _mean([float(e.steps) for e in episodes]),
            "episodes/rows": sum(len(e.rows) for e in episodes),
        }

    def save_policy(self, directory: Path) -> None:
        self.policy.save(directory)

    def load_policy(self, directory: Path) -> None:
        self.policy.load_state_dict(
            torch.load(directory / "model.pt", map_location=self.policy.device, weights_only=True)
        )


def _mean(xs: list[float]) -> float | None:
    return float(np.mean(xs)) if xs else None


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
            device = policy.device  # rows are kept on the CPU; the policy may sit on a GPU
            tokens = torch.stack([b[1] for b in batch]).to(device)
            old = torch.stack([b[2] for b in batch]).to(device)
            adv_t = torch.tensor([b[3] for b in batch], dtype=torch.float32, device=device)
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
                entropy_coef=config.entropy_coef,
                aggregation=config.loss_aggregation,
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
