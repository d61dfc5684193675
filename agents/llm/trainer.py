"""The LLM half of GRPO: an :class:`LLMAgent` for the shared loop (:func:`agents.grpo.train`).

The same loop runs plain GRPO on real execution (a bare env or the ``real`` stack), GRPO on
a pure world model (``wm``) and WMRL (``wmrl``): the agent reads only what the stack reports
in ``info`` and talks to the stack through nothing but a :class:`~wrappers.StackHandle`
(held by the loop). Per step the agent picks ``groups_per_step`` tasks, rolls out
``group_size`` episodes per task (:class:`~agents.llm.rollout.Rollout`), and, given the
loop's advantages, takes ``ppo_epochs`` optimiser steps on the clipped token loss
(:func:`agents.grpo.grpo_loss`).

Anchor metrics count two different things: ``anchor/groups`` and ``anchor/realized_fraction``
are the groups *chosen* as anchors at reset; ``groups/anchor`` the anchor groups that also
*produced advantages* (>= 2 members graded for real). They differ when anchor members are
never executed, e.g. every reply malformed (decided for free, without a grading).

Classes: :class:`GRPOConfig`, :class:`LLMAgent`. (Supervised warm start:
:func:`agents.llm.warm_start.warm_start`; a checkpoint's weights for evaluation:
:func:`agents.llm.loading.load_policy`.)

Example (see ``tests/test_llm_agent_e2e.py`` for a runnable one)::

    policy = LLMPolicy.default()
    env = build_stack(make_vector_env("wmrl/AutoResearch-v0", 8, split="train"), "wmrl", wm)
    config = GRPOConfig(total_steps=20, output_dir="runs/x")
    result = train(LLMAgent(policy, env, PlanScaffold(), config, tasks=list_catalog("train")))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents.grpo import GRPOLoopConfig, grpo_loss
from agents.llm.policy import LLMPolicy
from agents.llm.rollout import Episode, PhaseTimer, Rollout
from agents.llm.scaffolds import Scaffold

__all__ = ["GRPOConfig", "LLMAgent"]

#: Phases of a rollout the agent times (the loop times the update itself).
_PHASES = ("generation", "real_grading", "wm_grading", "env_other", "env_reset")


@dataclass
class GRPOConfig(GRPOLoopConfig):
    """Settings of the LLM agent (defaults sized for a small model on a few CPU cores): those of
    :class:`~agents.grpo.GRPOLoopConfig` plus

    Attributes:
        max_new_tokens: tokens sampled per turn. Default 96.
        top_p: nucleus sampling. Default 1.0.
        generation_batch_size: contexts per ``generate`` call (``None`` = all live slots).
        entropy_coef: entropy bonus. Default 0.0.
        idle_action: action for slots whose episode ended while others still run. Default "".

    Members whose advantage is 0 (degenerate groups, or a member exactly at its group's mean)
    or unknown are dropped from the update: they carry no policy gradient, so this saves their
    forward/backward pass. It does change the denominator: with ``"token-mean"`` the loss is
    divided by the action tokens of the *kept* members only (TRL counts every completion's
    tokens), so a step whose batch holds many degenerate groups takes a proportionally larger
    step per informative token, by ``all tokens / kept tokens``; with
    ``"seq-mean-token-mean"`` it is the mean over kept sequences. With ``beta > 0`` the
    dropped members' KL term is skipped too.
    """

    max_new_tokens: int = 96
    top_p: float = 1.0
    generation_batch_size: int | None = None
    entropy_coef: float = 0.0
    idle_action: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_new_tokens < 1:
            raise ValueError(f"GRPOConfig.max_new_tokens must be >= 1, got {self.max_new_tokens}")


class LLMAgent:
    """An LLM policy acting in ``env`` through ``scaffold`` on ``tasks`` (a
    :class:`~agents.grpo.GRPOAgent`).

    Args:
        policy: the :class:`~agents.llm.policy.LLMPolicy` to train in place.
        env: the env stack. A vector env needs ``num_envs`` a multiple of ``group_size``;
            ``num_envs = groups_per_step * group_size`` runs a whole step in one round.
        scaffold: turns model text into the env's action.
        config: :class:`GRPOConfig`.
        tasks: task ids to sample training instances from (passed as ``options["task"]``).
    """

    def __init__(
        self, policy: LLMPolicy, env: Any, scaffold: Scaffold, config: GRPOConfig | None = None, *, tasks: Sequence[str]
    ) -> None:
        if not tasks:
            raise ValueError("LLMAgent: `tasks` must name at least one task")
        self.policy, self.env, self.scaffold = policy, env, scaffold
        self.config = config or GRPOConfig()
        self.tasks = list(tasks)
        c = self.config
        self.rollout = Rollout(
            env,
            policy,
            scaffold,
            group_size=c.group_size,
            max_new_tokens=c.max_new_tokens,
            temperature=c.temperature,
            top_p=c.top_p,
            generation_batch_size=c.generation_batch_size,
            idle_action=c.idle_action,
        )

    def parameters(self) -> Any:
        return self.policy.trainable_parameters()

    def select(self, step: int, rng: np.random.Generator) -> list[tuple[str, Any]]:
        n = self.config.groups_per_step
        chosen = [str(t) for t in rng.choice(self.tasks, size=n, replace=len(self.tasks) < n)]
        return [(f"s{step}-g{j}", task) for j, task in enumerate(chosen)]

    def collect(
        self, groups: Sequence[tuple[str, Any]], rng: np.random.Generator
    ) -> tuple[list[Episode], dict[str, Any]]:
        timer = PhaseTimer()
        episodes = self.rollout.run([(task, gid) for gid, task in groups], timer, seed=int(rng.integers(2**31)))
        timings = {f"time/{p}_wall": timer.wall.get(p, 0.0) for p in _PHASES}
        timings |= {f"time/{p}_cpu": timer.cpu.get(p, 0.0) for p in _PHASES}
        return episodes, timings

    def update(
        self, episodes: Sequence[Episode], advantages: Sequence[float], optimizer: torch.optim.Optimizer, rng: Any
    ) -> dict[str, float]:
        return _update(self.policy, optimizer, episodes, advantages, self.config)

    def step_metrics(self, episodes: Sequence[Episode]) -> dict[str, Any]:
        """Valid and malformed rates over the episodes' outcomes, and turns per episode."""
        statuses = [[getattr(o, "status", None) for o in e.outcomes] for e in episodes]
        return {
            "reward/valid_rate": _mean([float("valid" in s) for s in statuses]),
            "reward/malformed_rate": _mean([float(bool(s) and all(x == "malformed" for x in s)) for s in statuses]),
            "episodes/turns_mean": _mean([e.turns for e in episodes]),
        }

    def save_policy(self, directory: Path) -> None:
        torch.save(self.policy.trainable_state_dict(), directory / "policy.pt")

    def load_policy(self, directory: Path) -> None:
        from agents.llm.loading import load_policy_weights

        load_policy_weights(self.policy, directory / "policy.pt")


def _mean(xs: Sequence[float]) -> float | None:
    return float(np.mean(xs)) if len(xs) else None


def _update(
    policy: LLMPolicy,
    optimizer: torch.optim.Optimizer,
    episodes: Sequence[Episode],
    advantages: Sequence[float],
    config: GRPOConfig,
) -> dict[str, float]:
    """``ppo_epochs`` optimiser steps on the clipped loss over the episodes that carry advantages."""
    seqs = [e.sequence() for e in episodes]
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i][0]))  # less padding per micro-batch
    batches = [order[i : i + config.micro_batch_size] for i in range(0, len(order), config.micro_batch_size)]
    total_tokens = sum(sum(m) for _, m in seqs)
    if total_tokens == 0:
        return {}
    need_old = config.ppo_epochs > 1
    old: dict[int, torch.Tensor] = {}
    ref: dict[int, torch.Tensor] = {}
    with torch.no_grad():
        for b, idx in enumerate(batches):
            args = ([seqs[i][0] for i in idx], [seqs[i][1] for i in idx])
            if need_old:
                old[b] = policy.token_logprobs(*args)[0]
            if config.beta > 0:
                ref[b] = policy.token_logprobs(*args, reference=True)[0]
    policy.model.train()
    sums: dict[str, float] = {}
    for _ in range(config.ppo_epochs):
        optimizer.zero_grad(set_to_none=True)
        for b, idx in enumerate(batches):
            lp, ent, mask = policy.token_logprobs(
                [seqs[i][0] for i in idx], [seqs[i][1] for i in idx], with_entropy=config.entropy_coef > 0
            )
            adv = torch.tensor([advantages[i] for i in idx], dtype=lp.dtype, device=lp.device)
            out = grpo_loss(
                lp,
                old.get(b, lp.detach()),
                adv,
                mask,
                epsilon=config.epsilon,
                epsilon_high=config.epsilon_high,
                ref_logprobs=ref.get(b),
                beta=config.beta,
                entropy=ent,
                entropy_coef=config.entropy_coef,
                aggregation=config.loss_aggregation,
            )
            # Weight micro-batches so the accumulated gradient equals the full-batch aggregate.
            share = (
                float(mask.sum()) / total_tokens if config.loss_aggregation == "token-mean" else len(idx) / len(seqs)
            )
            (out.loss * share).backward()
            for k, v in out.metrics.items():
                sums[k] = sums.get(k, 0.0) + (v if k == "tokens" else v * share / config.ppo_epochs)
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), config.max_grad_norm)
        optimizer.step()
    policy.sync_backend()
    sums["tokens"] /= config.ppo_epochs
    return {f"loss/{k}": v for k, v in sums.items()} | {"loss/grad_norm": float(grad_norm)}
