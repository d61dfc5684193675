"""GRPO training of an LLM policy through a Gymnasium env stack, with or without world models.

The same :func:`train` runs plain GRPO on real execution (a bare env), GRPO on a pure world
model (``WorldModelWrapper(env, wm)``) and WMRL
(``CalibrationWrapper(AnchorWrapper(WorldModelWrapper(env, wm)))``): it only reads what the
stack reports in ``info`` (``trajectory_reward``, ``source``, ``anchor``, ``calibrated``,
``real_executions``) and never asks which layers exist, except to announce the step's groups
to an ``AnchorWrapper`` (``begin_step``, also the calibration map's refit boundary), to read
the anchor weight from a ``CalibrationWrapper`` once the step's rollout is over, and to
checkpoint the stack's state.

Each step: pick ``groups_per_step`` tasks, roll out ``group_size`` episodes per task (one
``group_id`` per group), compute group advantages with the current anchor weight
(:func:`agents.grpo.group_advantages`), and take ``ppo_epochs`` optimiser steps on the
clipped token loss (:func:`agents.grpo.grpo_loss`). Metrics go to ``metrics.jsonl`` and
TensorBoard in ``output_dir``; checkpoints hold the policy (or adapter), optimiser, RNG
states and the wrapper stack's state (anchor pairs, calibration map, weight).

Anchor metrics count two different things: ``anchor/groups`` and ``anchor/realized_fraction``
are the groups *chosen* as anchors at reset; ``groups/anchor`` the anchor groups that also
*produced advantages* (>= 2 members graded for real). They differ when anchor members are
never executed, e.g. every reply malformed (decided for free, without a grading).
Warnings (:mod:`agents.llm.diagnostics`): steps without any learning signal, and WMRL
corrections that cannot engage within the run's budget.

Classes: :class:`GRPOConfig`, :class:`TrainResult`, :class:`Callback`, :class:`ExploitationGuard`.
Functions: :func:`train`, :func:`save_checkpoint`, :func:`load_checkpoint`,
:func:`step_metrics`, :func:`warm_start`. (Loading a checkpoint's weights for evaluation:
:func:`agents.llm.loading.load_policy`.)

Example (see ``tests/test_llm_agent_e2e.py`` for a runnable one)::

    policy = LLMPolicy.default()
    env = gym.make_vec("wmrl/AutoResearch-v0", num_envs=8, split="train", ...)
    result = train(policy, env, PlanScaffold(), GRPOConfig(total_steps=20, output_dir="runs/x"),
                   tasks=list_catalog("train"))
"""

from __future__ import annotations

import json
import math
import random
import resource
import time
import warnings
from collections.abc import Callable, Hashable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from agents.grpo import LOSS_AGGREGATIONS, LossAggregation, group_advantages, grpo_loss
from agents.llm.diagnostics import (
    CorrectionsIdleWarning,
    NoLearningSignalWarning,
    SignalWatch,
    anchors_per_step,
    corrections_budget,
)
from agents.llm.policy import LLMPolicy
from agents.llm.rollout import Episode, PhaseTimer, Rollout
from agents.llm.scaffolds import Scaffold, TaskSpec
from wrappers import (
    AnchorWrapper,
    CalibrationWrapper,
    VectorAnchorWrapper,
    VectorCalibrationWrapper,
    VectorWorldModelWrapper,
    WorldModelWrapper,
    find_layer,
)
from wrappers.monitor import anchor_group_stats

__all__ = [
    "GRPOConfig",
    "TrainResult",
    "Callback",
    "ExploitationGuard",
    "train",
    "save_checkpoint",
    "load_checkpoint",
    "step_metrics",
    "warm_start",
]

#: Called after every step with ``(step, metrics)``; returning ``True`` stops training.
Callback = Callable[[int, dict[str, Any]], "bool | None"]


@dataclass
class GRPOConfig:
    """Settings of :func:`train` (defaults sized for a small model on a few CPU cores).

    Sampling:
        groups_per_step: task instances (GRPO groups) per step, ``m``. Default 4.
        group_size: samples per task instance, ``n`` (>= 2 for non-zero advantages). Default 4.
        max_new_tokens: tokens sampled per turn. Default 96.
        temperature / top_p: sampling temperature (0 = greedy) and nucleus. Defaults 1.0 / 1.0.
        generation_batch_size: contexts per ``generate`` call (``None`` = all live slots).

    Optimisation:
        learning_rate: AdamW step size (use ~1e-4 with LoRA). Default 1e-5.
        weight_decay: AdamW weight decay. Default 0.0.
        max_grad_norm: gradient clipping. Default 1.0.
        ppo_epochs: optimiser steps per batch of rollouts; with 1 the ratio is exactly 1
            (pure on-policy, no extra forward pass). Default 1.
        micro_batch_size: sequences per forward/backward (gradient accumulation). Default 4.
        epsilon / epsilon_high: PPO clip range, lower / upper (``None`` = ``epsilon``); TRL's
            names. Defaults 0.2 / None.
        beta: weight of the k3 KL to the initial policy (0 disables the reference pass);
            TRL's name for the KL coefficient. Default 0.0.
        entropy_coef: entropy bonus. Default 0.0.
        scale_by_std: divide advantages by the group's population std (TRL divides by the
            sample std: see :mod:`agents.grpo`); ``False`` = Dr.GRPO's centring only.
            Default True.
        loss_aggregation: one of :data:`agents.grpo.LOSS_AGGREGATIONS`. Default "token-mean".

            Members whose advantage is 0 (degenerate groups, or a member exactly at its
            group's mean) or unknown are dropped from the update: they carry no policy
            gradient, so this saves their forward/backward pass. It does change the
            denominator: with ``"token-mean"`` the loss is divided by the action tokens of
            the *kept* members only (TRL counts every completion's tokens), so a step whose
            batch holds many degenerate groups takes a proportionally larger step per
            informative token, by ``all tokens / kept tokens``; with
            ``"seq-mean-token-mean"`` it is the mean over kept sequences. With ``beta > 0``
            the dropped members' KL term is skipped too.

    Run:
        total_steps: training steps. Default 10.
        seed: task sampling, group ids and sampling seeds. Default 0.
        output_dir: where ``metrics.jsonl``, TensorBoard events and checkpoints go
            (``None`` = nothing written). Default None.
        checkpoint_every: steps between checkpoints (0 = only the final one). Default 0.
        tensorboard: write TensorBoard events (needs ``tensorboard``). Default True.
        progress: show a tqdm bar. Default True.
        idle_action: action for slots whose episode ended while others still run. Default "".
        no_signal_patience: warn (``NoLearningSignalWarning``) after this many steps in a row
            in which no group had members with different rewards (0 = never). Default 3.
    """

    groups_per_step: int = 4
    group_size: int = 4
    max_new_tokens: int = 96
    temperature: float = 1.0
    top_p: float = 1.0
    generation_batch_size: int | None = None
    learning_rate: float = 1e-5
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    ppo_epochs: int = 1
    micro_batch_size: int = 4
    epsilon: float = 0.2
    epsilon_high: float | None = None
    beta: float = 0.0
    entropy_coef: float = 0.0
    scale_by_std: bool = True
    loss_aggregation: LossAggregation = "token-mean"
    total_steps: int = 10
    seed: int = 0
    output_dir: str | None = None
    checkpoint_every: int = 0
    tensorboard: bool = True
    progress: bool = True
    idle_action: str = ""
    no_signal_patience: int = 3

    def __post_init__(self) -> None:
        positive = ("groups_per_step", "group_size", "max_new_tokens", "ppo_epochs", "micro_batch_size", "total_steps")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"GRPOConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.loss_aggregation not in LOSS_AGGREGATIONS:
            raise ValueError(
                f"GRPOConfig.loss_aggregation must be one of {LOSS_AGGREGATIONS}, got {self.loss_aggregation!r}"
            )
        if self.learning_rate <= 0 or self.checkpoint_every < 0 or self.no_signal_patience < 0:
            raise ValueError(
                "GRPOConfig: learning_rate must be > 0, checkpoint_every and no_signal_patience >= 0, got "
                f"{self.learning_rate}, {self.checkpoint_every}, {self.no_signal_patience}"
            )


class ExploitationGuard:
    """A :data:`Callback` acting on the world-model exploitation monitor (``monitor/gap`` and
    ``monitor/rank_agreement`` in each step's metrics; see :mod:`wrappers.monitor`).

    The monitor's values are smoothed over the last ``window`` steps that had anchor groups.
    When the smoothed gap exceeds ``max_gap``, the rank agreement falls below
    ``min_rank_agreement``, or the share of anchor members whose real outcome is unknown
    (``monitor/grader_failure_rate``: the grader failed on them, so the gap cannot see them)
    exceeds ``max_grader_failure_rate`` (default 0.25: one in four), ``action="raise"`` multiplies the ``AnchorWrapper``'s target
    fraction by ``factor`` (up to ``max_fraction``; more real outcomes to calibrate on) and
    ``action="stop"`` ends training with a message naming what crossed which threshold.
    Every breach is recorded in :attr:`events` (and printed).

    Example::

        guard = ExploitationGuard(env, max_gap=0.15, action="raise")
        train(policy, env, scaffold, config, tasks=tasks, callbacks=[guard])
    """

    def __init__(
        self,
        env: Any,
        *,
        max_gap: float | None = None,
        min_rank_agreement: float | None = None,
        max_grader_failure_rate: float | None = 0.25,
        action: str = "raise",
        factor: float = 2.0,
        max_fraction: float = 0.5,
        window: int = 4,
    ) -> None:
        if action not in ("raise", "stop"):
            raise ValueError(f"action must be 'raise' or 'stop', got {action!r}")
        if max_gap is None and min_rank_agreement is None and max_grader_failure_rate is None:
            raise ValueError("ExploitationGuard needs max_gap, min_rank_agreement and/or max_grader_failure_rate")
        anchor = find_layer(env, (AnchorWrapper, VectorAnchorWrapper))
        if anchor is None:
            raise TypeError("ExploitationGuard needs an AnchorWrapper in the stack (the monitor reads anchor groups)")
        self.anchor: Any = anchor
        self.max_gap: float | None = max_gap
        self.min_rank_agreement: float | None = min_rank_agreement
        self.max_grader_failure_rate: float | None = max_grader_failure_rate
        self.action: str = action
        self.factor: float = factor
        self.max_fraction: float = max_fraction
        self.window: int = window
        self._gaps: list[float] = []
        self._ranks: list[float] = []
        self._failures: list[float] = []
        self.events: list[dict[str, Any]] = []

    def __call__(self, step: int, metrics: dict[str, Any]) -> bool:
        if metrics.get("monitor/gap") is not None:
            self._gaps = (self._gaps + [float(metrics["monitor/gap"])])[-self.window :]
        if metrics.get("monitor/rank_agreement") is not None:
            self._ranks = (self._ranks + [float(metrics["monitor/rank_agreement"])])[-self.window :]
        if metrics.get("monitor/grader_failure_rate") is not None:
            self._failures = (self._failures + [float(metrics["monitor/grader_failure_rate"])])[-self.window :]
        gap = float(np.mean(self._gaps)) if self._gaps else None
        rank = float(np.mean(self._ranks)) if self._ranks else None
        failures = float(np.mean(self._failures)) if self._failures else None
        breach = None
        if self.max_gap is not None and gap is not None and gap > self.max_gap:
            breach = f"calibrated world-model scores exceed real scores by {gap:.3f} on anchor groups (max_gap {self.max_gap})"
        elif self.min_rank_agreement is not None and rank is not None and rank < self.min_rank_agreement:
            breach = f"world-model rank agreement on anchor groups fell to {rank:.3f} (min_rank_agreement {self.min_rank_agreement})"
        elif (
            self.max_grader_failure_rate is not None
            and failures is not None
            and failures > self.max_grader_failure_rate
        ):
            breach = (
                f"the real outcome of {failures:.0%} of anchor members is unknown (grader failures hide them from "
                f"the gap; max_grader_failure_rate {self.max_grader_failure_rate})"
            )
        if breach is None:
            return False
        scheduler = self.anchor.scheduler
        if self.action == "stop":
            self.events.append({"step": step, "action": "stop", "reason": breach})
            print(f"step {step}: stopping: {breach}; the policy may be exploiting the world model", flush=True)
            return True
        old = scheduler.fraction
        new = min(self.max_fraction, old * self.factor) if old > 0 else min(self.max_fraction, 0.1)
        if new > old:
            scheduler.fraction = new
            self.events.append({"step": step, "action": "raise", "reason": breach, "fraction": new})
            print(f"step {step}: {breach}; anchor fraction {old:g} -> {new:g}", flush=True)
            self._gaps, self._ranks, self._failures = [], [], []  # judge the new fraction on fresh evidence
        return False


@dataclass
class TrainResult:
    """What :func:`train` returns: one metrics dict per step run in this call.

    Attributes:
        history: one metrics dict per step run in this call.
        last_step: the step reached (the resumed step when nothing ran).
        start_step: the step this call started from (> 0 when it resumed).
        steps_without_signal: steps of this call in which no group carried a learning signal.
        warnings: the texts of the warnings this call emitted (no signal, idle corrections).
    """

    history: list[dict[str, Any]] = field(default_factory=list)
    last_step: int = 0
    start_step: int = 0
    steps_without_signal: int = 0
    warnings: list[str] = field(default_factory=list)


def _mean(xs: Sequence[float]) -> float | None:
    return float(np.mean(xs)) if len(xs) else None


def _rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def _wrapper_state(env: Any) -> dict[str, Any] | None:
    if find_layer(env, (WorldModelWrapper, VectorWorldModelWrapper)) is None:
        return None
    from wrappers import stack_state_dict

    return stack_state_dict(env)


def save_checkpoint(
    path: str | Path, policy: LLMPolicy, optimizer: torch.optim.Optimizer, env: Any, step: int, extra: dict[str, Any]
) -> Path:
    """Write ``path/`` with the trainable weights, optimiser, RNG and wrapper-stack state.

    Written to a temporary directory and renamed, so a run killed mid-write keeps its
    previous checkpoint.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    torch.save(policy.trainable_state_dict(), tmp / "policy.pt")
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(_rng_state(), tmp / "rng.pt")
    wrapper_state = _wrapper_state(env)
    if wrapper_state is not None:
        (tmp / "wrappers.json").write_text(json.dumps(wrapper_state, default=_json_default))
    (tmp / "trainer.json").write_text(json.dumps({"step": step, **extra}, default=_json_default))
    if path.exists():
        old = path.with_name(path.name + ".old")
        path.rename(old)
        tmp.rename(path)
        _rmtree(old)
    else:
        tmp.rename(path)
    return path


def load_checkpoint(
    path: str | Path, policy: LLMPolicy, optimizer: torch.optim.Optimizer | None, env: Any
) -> dict[str, Any]:
    """Restore what :func:`save_checkpoint` wrote; returns ``trainer.json`` (``step``, ...)."""
    from agents.llm.loading import load_policy_weights

    path = Path(path)
    if not (path / "trainer.json").is_file():
        raise FileNotFoundError(f"{path} is not a checkpoint (no trainer.json)")
    wrappers_file = path / "wrappers.json"
    has_layers = _wrapper_state(env) is not None
    if wrappers_file.is_file() != has_layers:
        saved, now = ("a world-model stack", "a bare env") if not has_layers else ("a bare env", "a world-model stack")
        raise ValueError(
            f"{path} was saved from {saved} but this env is {now}: resume with the stack it was saved with"
        )
    load_policy_weights(policy, path / "policy.pt")
    if optimizer is not None:
        optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
    _set_rng_state(torch.load(path / "rng.pt", weights_only=False))
    if wrappers_file.is_file():
        from wrappers import load_stack_state_dict

        load_stack_state_dict(env, json.loads(wrappers_file.read_text()))
    return json.loads((path / "trainer.json").read_text())


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if hasattr(o, "to_dict"):
        return o.to_dict()
    return str(o)


def step_metrics(episodes: Sequence[Episode], anchor_weight: float) -> dict[str, Any]:
    """Rewards by source, anchor share and calibration state of one step's episodes."""
    by_group: dict[Hashable, list[Episode]] = {}
    for e in episodes:
        by_group.setdefault(e.group_id, []).append(e)
    graded = [e.reward for e in episodes if e.reward is not None]
    last = episodes[-1].final_info if episodes else {}
    out: dict[str, Any] = {
        "reward/mean": _mean(graded),
        "reward/env": _mean([e.reward for e in episodes if e.reward is not None and e.source == "env"]),
        "reward/wm": _mean([e.reward for e in episodes if e.reward is not None and e.source == "wm"]),
        "reward/valid_rate": _mean(
            [float(any(getattr(o, "status", None) == "valid" for o in e.outcomes)) for e in episodes]
        ),
        "reward/malformed_rate": _mean(
            [
                float(bool(e.outcomes) and all(getattr(o, "status", None) == "malformed" for o in e.outcomes))
                for e in episodes
            ]
        ),
        "reward/unknown_fraction": 1.0 - len(graded) / len(episodes) if episodes else None,
        # Anchor groups as decided at reset; `groups/anchor` (set by train) counts only those
        # that also produced advantages, i.e. had >= 2 members graded for real.
        "anchor/realized_fraction": _mean([float(g[0].anchor) for g in by_group.values()]),
        "anchor/groups": sum(g[0].anchor for g in by_group.values()),
        "anchor/weight": anchor_weight,
        "calibration/fitted": last.get("calibrated"),
        "calibration/anchor_pairs_total": last.get("anchor_pairs_total"),
        "episodes/turns_mean": _mean([e.turns for e in episodes]),
        "episodes/count": len(episodes),
    }
    # World-model exploitation monitor: calibrated-vs-real gap and rank agreement on the
    # anchor groups that completed in this step (the current policy's own samples).
    monitor = anchor_group_stats(
        e.final_info["group_result"] for e in episodes if isinstance(e.final_info.get("group_result"), dict)
    )
    out.update({f"monitor/{k}": v for k, v in monitor.items()})
    return out


class _Logger:
    def __init__(self, output_dir: Path | None, tensorboard: bool) -> None:
        self.jsonl = None
        self.tb = None
        if output_dir is None:
            return
        output_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = open(output_dir / "metrics.jsonl", "a")
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(output_dir / "tb"))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if self.jsonl is not None:
            self.jsonl.write(json.dumps({"step": step, **metrics}, default=_json_default) + "\n")
            self.jsonl.flush()
        if self.tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    self.tb.add_scalar(k, v, step)
            self.tb.flush()

    def close(self) -> None:
        if self.jsonl is not None:
            self.jsonl.close()
        if self.tb is not None:
            self.tb.close()


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


def warm_start(
    policy: LLMPolicy,
    scaffold: Scaffold,
    specs: Sequence[TaskSpec],
    replies: Sequence[str],
    *,
    steps: int = 30,
    learning_rate: float = 3e-3,
    seed: int = 0,
) -> list[float]:
    """Supervised warm start: maximise the likelihood of demonstration ``replies`` (the text
    the model should write after the scaffold's response prefix) on the scaffold's prompts
    for ``specs``; one full batch of ``len(replies)`` (reply, random spec) pairs per step.

    Meant for small from-config models that cannot yet follow the format at all; returns
    the loss per step.
    """
    if not specs or not replies:
        raise ValueError("warm_start needs at least one task spec and one reply")
    rng = random.Random(seed)
    prefix = (
        policy.tokenizer(scaffold.response_prefix, add_special_tokens=False)["input_ids"]
        if scaffold.response_prefix
        else []
    )
    prompts = {s.task_id: policy.chat_ids(scaffold.initial_messages("", s)) + list(prefix) for s in specs}
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=learning_rate)
    losses = []
    policy.model.train()
    for _ in range(steps):
        seqs, masks = [], []
        for reply in replies:
            ctx = prompts[rng.choice(specs).task_id]
            target = policy.tokenizer(reply, add_special_tokens=False)["input_ids"] + [policy.eos_token_id]
            seqs.append(ctx + target)
            masks.append([0] * len(ctx) + [1] * len(target))
        lp, _, mask = policy.token_logprobs(seqs, masks)
        loss = -(lp * mask).sum() / mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    policy.sync_backend()
    return losses


def train(
    policy: LLMPolicy,
    env: Any,
    scaffold: Scaffold,
    config: GRPOConfig | None = None,
    *,
    tasks: Sequence[str],
    callbacks: Sequence[Callback] = (),
    resume: bool | str | Path = False,
    run_info: dict[str, Any] | None = None,
) -> TrainResult:
    """Train ``policy`` with GRPO on ``env`` (a ``gymnasium.Env`` or ``VectorEnv`` stack).

    Args:
        policy: the :class:`~agents.llm.policy.LLMPolicy` to train in place.
        env: the env stack. A vector env needs ``num_envs`` a multiple of ``group_size``;
            ``num_envs = groups_per_step * group_size`` runs a whole step in one round.
        scaffold: turns model text into the env's action.
        config: :class:`GRPOConfig`.
        tasks: task ids to sample training instances from (passed as ``options["task"]``).
        callbacks: called after each step with ``(step, metrics)``; ``True`` stops training.
        resume: ``True`` resumes from ``output_dir/checkpoint`` if present; a path resumes
            from that checkpoint.
        run_info: what built the run (policy, stack, scaffold, ...), saved in every
            checkpoint's ``trainer.json`` under ``setup`` so the checkpoint describes itself.

    Warns:
        NoLearningSignalWarning: ``no_signal_patience`` steps in a row without a group
            whose members' rewards differ (the updates change nothing).
        CorrectionsIdleWarning: a calibrated stack whose remaining steps cannot collect the
            anchor pairs of the first isotonic fit.

    Returns:
        :class:`TrainResult` with the per-step metrics of this call.
    """
    config = config or GRPOConfig()
    if not tasks:
        raise ValueError("train: `tasks` must name at least one task")
    out_dir = Path(config.output_dir) if config.output_dir else None
    optimizer = torch.optim.AdamW(
        policy.trainable_parameters(), lr=config.learning_rate, weight_decay=config.weight_decay
    )
    start_step = 0
    random.seed(config.seed)
    np.random.seed(config.seed)
    torch.manual_seed(config.seed)
    checkpoint = (
        Path(resume) if isinstance(resume, (str, Path)) else (out_dir / "checkpoint" if out_dir and resume else None)
    )
    real_total = 0
    if checkpoint is not None and (checkpoint / "trainer.json").is_file():
        saved = load_checkpoint(checkpoint, policy, optimizer, env)
        start_step, real_total = int(saved["step"]), int(saved.get("real_executions_total") or 0)
    elif isinstance(resume, (str, Path)):
        raise FileNotFoundError(f"resume: no checkpoint at {checkpoint}")

    rollout = Rollout(
        env,
        policy,
        scaffold,
        group_size=config.group_size,
        max_new_tokens=config.max_new_tokens,
        temperature=config.temperature,
        top_p=config.top_p,
        generation_batch_size=config.generation_batch_size,
        idle_action=config.idle_action,
    )
    anchor_layer = find_layer(env, (AnchorWrapper, VectorAnchorWrapper))
    wm_layer = find_layer(env, (WorldModelWrapper, VectorWorldModelWrapper))
    calibration_layer = find_layer(env, (CalibrationWrapper, VectorCalibrationWrapper))
    logger = _Logger(out_dir, config.tensorboard)
    result = TrainResult(last_step=start_step, start_step=start_step)
    anchor_weight = 1.0
    watch = SignalWatch(min(config.no_signal_patience, max(1, config.total_steps - start_step)))
    if calibration_layer is not None and anchor_layer is not None and start_step < config.total_steps:
        cal = calibration_layer.calibrator
        idle = (
            None
            if cal.debiaser.fitted or not (cal.config.debias or cal.config.denoise)
            else corrections_budget(
                start_pairs=cal.config.start_pairs,
                pairs_seen=cal.debiaser.n_seen,
                steps=config.total_steps - start_step,
                anchors_per_step=anchors_per_step(
                    anchor_layer.scheduler.fraction, anchor_layer.scheduler.min_per_step, config.groups_per_step
                ),
                group_size=config.group_size,
            )
        )
        if idle is not None:
            result.warnings.append(idle)
            warnings.warn(idle, CorrectionsIdleWarning, stacklevel=2)
    bar = tqdm(
        range(start_step, config.total_steps),
        initial=start_step,
        total=config.total_steps,
        desc="GRPO",
        disable=not config.progress,
    )
    try:
        for step in bar:
            t_step = time.perf_counter()
            timer = PhaseTimer()
            rng = np.random.default_rng([config.seed, step])
            chosen = [
                str(t)
                for t in rng.choice(
                    list(tasks), size=config.groups_per_step, replace=len(tasks) < config.groups_per_step
                )
            ]
            groups = [(task, f"s{step}-g{j}") for j, task in enumerate(chosen)]
            if anchor_layer is not None:
                anchor_layer.begin_step([g for _, g in groups])
            real_before = wm_layer.counters.real_executions if wm_layer is not None else None
            episodes = rollout.run(groups, timer, seed=int(rng.integers(2**31)))

            # The weight once the whole rollout is over (every anchor group of the step
            # observed), not the one in some episode's final info: the last listed episode
            # need not be the last to finish, and groups finishing after it move the weight.
            anchor_weight = calibration_layer.anchor_weight if calibration_layer is not None else 1.0
            adv = group_advantages(
                [e.reward for e in episodes],
                [e.group_id for e in episodes],
                sources=[e.source for e in episodes],
                anchor_weight=anchor_weight,
                scale_by_std=config.scale_by_std,
            )
            # Zero-advantage members carry no policy gradient; skipping them saves their
            # forward/backward (with beta > 0 their KL term is skipped too; see GRPOConfig for
            # what this does to the token-mean denominator).
            used = [(e, a) for e, a in zip(episodes, adv.advantages) if a is not None and a != 0.0]
            with timer.measure("update"):
                loss_metrics = (
                    _update(policy, optimizer, [e for e, _ in used], [a for _, a in used], config) if used else {}
                )

            if wm_layer is not None:
                real_step = wm_layer.counters.real_executions - real_before
                real_total = wm_layer.counters.real_executions
            else:  # a bare env executes every step that had a grading request
                real_step = sum(e.graded_steps for e in episodes)
                real_total += real_step
            metrics = step_metrics(episodes, anchor_weight)
            metrics.update(loss_metrics)
            s = adv.stats
            metrics.update(
                {
                    "groups/used": s.groups_used,
                    "groups/skipped": s.groups_skipped,
                    "groups/degenerate": s.groups_degenerate,
                    "groups/anchor": s.anchor_groups,
                    "real_executions/step": real_step,
                    "real_executions/total": real_total,
                    "time/step_wall": time.perf_counter() - t_step,
                    "memory/peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                }
            )
            for phase in ("generation", "real_grading", "wm_grading", "env_other", "env_reset", "update"):
                metrics[f"time/{phase}_wall"] = timer.wall.get(phase, 0.0)
                metrics[f"time/{phase}_cpu"] = timer.cpu.get(phase, 0.0)
            logger.log(step + 1, metrics)
            result.history.append({"step": step + 1, **metrics})
            result.last_step = step + 1
            no_signal = watch.update(step + 1, metrics)
            if no_signal is not None:
                result.warnings.append(no_signal)
                warnings.warn(no_signal, NoLearningSignalWarning, stacklevel=2)
            result.steps_without_signal = watch.steps_without_signal
            bar.set_postfix(
                reward=f"{metrics['reward/mean']:.3f}" if metrics["reward/mean"] is not None else "n/a",
                w=f"{anchor_weight:.2f}",
            )
            done = step + 1 == config.total_steps
            extra = {"config": asdict(config), "real_executions_total": real_total}
            if run_info is not None:
                extra["setup"] = run_info
            saved_now = out_dir is not None and (
                done or (config.checkpoint_every > 0 and (step + 1) % config.checkpoint_every == 0)
            )
            if saved_now and out_dir is not None:  # saved_now implies out_dir
                save_checkpoint(out_dir / "checkpoint", policy, optimizer, env, step + 1, extra)
            if any(cb(step + 1, metrics) for cb in callbacks):
                if out_dir is not None and not saved_now:
                    save_checkpoint(out_dir / "checkpoint", policy, optimizer, env, step + 1, extra)
                break
    finally:
        bar.close()
        logger.close()
    return result
