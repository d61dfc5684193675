"""The GRPO loop shared by every agent: one step reads top to bottom.

Per step::

    groups   = agent.select(step, rng)                   # which GRPO groups, with their ids
    handle.begin_step(group ids)                          # anchors decided; calibration refit boundary
    episodes = agent.collect(groups, rng)                 # rewards come from the stack's step reward
    weight   = handle.anchor_weight                       # once the whole rollout is over
    adv      = group_advantages(rewards, groups, sources, anchor_weight=weight)
    rollback.observe(...)                                 # mostly valid replies: keep the policy that wrote them
    agent.update(members with a non-zero advantage, optimizer, rng)
    watch.update(...)                                     # no signal; collapsed off the format -> rollback.restore
    log, checkpoint (policy + optimizer + RNG + stack state), callbacks

An agent (:class:`GRPOAgent`) supplies only what differs between an LLM and a VLA: how a
step's groups are chosen, how episodes are collected, the policy update, its own metrics
and how its policy weights are saved. Everything it learns about the stack comes through
one :class:`~wrappers.StackHandle` (``agent.env``'s) and the ``info`` of its own steps.

Classes: :class:`GRPOLoopConfig`, :class:`GRPOAgent`, :class:`Episode`,
:class:`TrainResult`, :class:`ExploitationGuard` (and :class:`~agents.grpo.rollback.FormatRollback`,
which the loop runs). Functions: :func:`train`,
:func:`step_metrics`, :func:`save_checkpoint`, :func:`load_checkpoint`.
"""

from __future__ import annotations

import json
import math
import random
import resource
import shutil
import time
import warnings
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from tqdm.auto import tqdm

from agents.grpo.diagnostics import CorrectionsIdleWarning, NoLearningSignalWarning, SignalWatch
from agents.grpo.objective import LOSS_AGGREGATIONS, LossAggregation, group_advantages
from agents.grpo.rollback import FormatRollback
from wrappers import StackHandle

__all__ = [
    "GRPOLoopConfig",
    "GRPOAgent",
    "Episode",
    "TrainResult",
    "Callback",
    "ExploitationGuard",
    "DEFAULT_GUARD",
    "GUARD_ACTIONS",
    "train",
    "step_metrics",
    "save_checkpoint",
    "load_checkpoint",
]

#: Called after every step with ``(step, metrics)``; returning ``True`` stops training.
Callback = Callable[[int, dict[str, Any]], "bool | None"]

#: What an :class:`ExploitationGuard` does on a breach.
GUARD_ACTIONS = ("raise", "stop", "escalate")

#: The guard :func:`train` adds on a stack with anchor groups (``GRPOLoopConfig.exploitation_guard``):
#: calibrated-minus-real gap over 0.15, smoothed over the last 8 anchored steps once there are
#: 8, or a quarter of anchor members with unknown real outcomes -> double the anchor share (up
#: to 0.5), then stop. Measured on the small-tier rich-grammar protocol's WMRL arm (seed 0, 439
#: anchored steps, docs/results/speedup-protocol-small-rich): the 8-step smoothed gap peaked at
#: 0.078 (99th percentile 0.056), so a run like it never triggers it.
DEFAULT_GUARD: dict[str, Any] = {"max_gap": 0.15, "window": 8, "min_steps": 8, "action": "escalate"}


@dataclass
class GRPOLoopConfig:
    """The settings every GRPO agent shares (TRL's names where the concept is the same).

    Sampling:
        groups_per_step: GRPO groups (task instances, initial states) per step, ``m``. Default 4.
        group_size: samples per group, ``n`` (>= 2 for non-zero advantages). Default 4.
        temperature: sampling temperature (0 = greedy; the loss uses the same). Default 1.0.

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
        scale_by_std: divide advantages by the group's population std (TRL divides by the
            sample std: see :mod:`agents.grpo`); ``False`` = Dr.GRPO's centring only.
            Default True.
        loss_aggregation: one of :data:`agents.grpo.LOSS_AGGREGATIONS`. Default "token-mean".

    Run:
        total_steps: training steps. Default 10.
        seed: group choice, group ids, sampling seeds and the update's subsampling. Default 0.
        output_dir: where ``metrics.jsonl``, TensorBoard events and checkpoints go
            (``None`` = nothing written). Default None.
        checkpoint_every: steps between checkpoints (0 = only the final one). Default 0.
        tensorboard: write TensorBoard events (needs ``tensorboard``). Default True.
        progress: show a tqdm bar. Default True.
        no_signal_patience: warn (``NoLearningSignalWarning``) after this many steps in a row
            in which no group had members with different rewards (0 = never). Default 3.
        max_rollbacks: when such a streak is a collapse off the scaffold's format (replies
            mostly malformed after steps of mostly valid ones), restore the last policy and
            optimiser state whose replies were mostly valid and scale the learning rate by
            ``rollback_lr_factor``, at most this many times (0 = never; see
            :class:`~agents.grpo.rollback.FormatRollback`). Default 3.
        rollback_lr_factor: the learning rate's factor on each rollback. Default 0.5.
        warmup_steps: optimiser steps over which the learning rate rises linearly to
            ``learning_rate`` (TRL's name; 0 = none). Adam's first steps move every weight by
            about the learning rate whatever its gradient's size: at 1e-3 the tiny plan policy's
            first step with every reply malformed came at step 2-10 (5 seeds), with a 10-step
            warmup at step 3-15 (``docs/results/format-collapse/``). A rollback restores the optimiser
            state, so the warmup counts from the restored step count. Default 0.
        exploitation_guard: on a stack with anchor groups, watch for exploitation of the
            world model with :data:`DEFAULT_GUARD` (raise the anchor share, then stop with a
            message) unless an :class:`ExploitationGuard` is among the callbacks already.
            Default True.
    """

    groups_per_step: int = 4
    group_size: int = 4
    temperature: float = 1.0
    learning_rate: float = 1e-5
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    ppo_epochs: int = 1
    micro_batch_size: int = 4
    epsilon: float = 0.2
    epsilon_high: float | None = None
    beta: float = 0.0
    scale_by_std: bool = True
    loss_aggregation: LossAggregation = "token-mean"
    total_steps: int = 10
    seed: int = 0
    output_dir: str | None = None
    checkpoint_every: int = 0
    tensorboard: bool = True
    progress: bool = True
    no_signal_patience: int = 3
    max_rollbacks: int = 3
    rollback_lr_factor: float = 0.5
    warmup_steps: int = 0
    exploitation_guard: bool = True

    def __post_init__(self) -> None:
        name = type(self).__name__
        for key in ("groups_per_step", "group_size", "ppo_epochs", "micro_batch_size", "total_steps"):
            if getattr(self, key) < 1:
                raise ValueError(f"{name}.{key} must be >= 1, got {getattr(self, key)}")
        if self.loss_aggregation not in LOSS_AGGREGATIONS:
            raise ValueError(
                f"{name}.loss_aggregation must be one of {LOSS_AGGREGATIONS}, got {self.loss_aggregation!r}"
            )
        counts = (self.checkpoint_every, self.no_signal_patience, self.max_rollbacks, self.warmup_steps)
        if self.learning_rate <= 0 or min(counts) < 0:
            raise ValueError(
                f"{name}: learning_rate must be > 0, checkpoint_every, no_signal_patience, max_rollbacks and "
                f"warmup_steps >= 0, got {self.learning_rate}, {counts}"
            )
        if not 0.0 < self.rollback_lr_factor <= 1.0:
            raise ValueError(f"{name}.rollback_lr_factor must be in (0, 1], got {self.rollback_lr_factor}")


class Episode(Protocol):
    """What the loop reads of a collected episode."""

    group_id: Hashable
    reward: float | None  # the trajectory's reward as the stack reported it; None = unknown
    source: str | None  # "env" (graded for real), "wm" (world model), None (nothing graded)
    anchor: bool
    final_info: dict[str, Any]

    @property
    def graded_steps(self) -> int: ...  # steps that asked the env for a grading


class GRPOAgent(Protocol):
    """What an agent supplies to :func:`train`: the policy-specific half of GRPO."""

    @property
    def env(self) -> Any:
        """The env stack the agent acts in."""
        ...

    @property
    def config(self) -> GRPOLoopConfig: ...

    def parameters(self) -> Iterable[torch.nn.Parameter]:
        """The trainable parameters (the optimiser's)."""
        ...

    def select(self, step: int, rng: np.random.Generator) -> list[tuple[str, Any]]:
        """The step's ``groups_per_step`` groups as ``(group_id, what the group starts from)``."""
        ...

    def collect(self, groups: Sequence[tuple[str, Any]], rng: np.random.Generator) -> tuple[list[Any], dict[str, Any]]:
        """``group_size`` episodes per group, and the agent's collection metrics (timings)."""
        ...

    def update(
        self,
        episodes: Sequence[Any],
        advantages: Sequence[float],
        optimizer: torch.optim.Optimizer,
        rng: np.random.Generator,
    ) -> dict[str, float]:
        """The policy update on the members that carry an advantage; its ``loss/*`` metrics."""
        ...

    def step_metrics(self, episodes: Sequence[Any]) -> dict[str, Any]:
        """Metrics only this agent can compute (valid rate, success rate, ...)."""
        ...

    def save_policy(self, directory: Path) -> None: ...

    def load_policy(self, directory: Path) -> None: ...


@dataclass
class TrainResult:
    """What :func:`train` returns.

    Attributes:
        history: one metrics dict per step run in this call.
        last_step: the step reached (the resumed step when nothing ran).
        start_step: the step this call started from (> 0 when it resumed).
        steps_without_signal: steps of this call in which no group carried a learning signal.
        warnings: the texts of the warnings this call emitted (no signal, idle corrections) and
            what the default exploitation guard did (raised the anchor share, stopped).
        rollbacks: what each rollback after a collapse off the format did (see
            ``GRPOLoopConfig.max_rollbacks``).
    """

    history: list[dict[str, Any]] = field(default_factory=list)
    last_step: int = 0
    start_step: int = 0
    steps_without_signal: int = 0
    warnings: list[str] = field(default_factory=list)
    rollbacks: list[str] = field(default_factory=list)


def _mean(xs: Sequence[float]) -> float | None:
    return float(np.mean(xs)) if len(xs) else None


def step_metrics(episodes: Sequence[Any], anchor_weight: float) -> dict[str, Any]:
    """Rewards by source, anchor share, calibration state and the exploitation monitor of
    one step's episodes (any agent's)."""
    by_group: dict[Hashable, list[Any]] = {}
    for e in episodes:
        by_group.setdefault(e.group_id, []).append(e)
    graded = [e.reward for e in episodes if e.reward is not None]
    last = episodes[-1].final_info if episodes else {}
    out: dict[str, Any] = {
        "reward/mean": _mean(graded),
        "reward/env": _mean([e.reward for e in episodes if e.reward is not None and e.source == "env"]),
        "reward/wm": _mean([e.reward for e in episodes if e.reward is not None and e.source == "wm"]),
        "reward/unknown_fraction": 1.0 - len(graded) / len(episodes) if episodes else None,
        # Anchor groups as decided at reset; `groups/anchor` counts only those that also
        # produced advantages, i.e. had >= 2 members graded for real.
        "anchor/realized_fraction": _mean([float(g[0].anchor) for g in by_group.values()]),
        "anchor/groups": sum(g[0].anchor for g in by_group.values()),
        "anchor/weight": anchor_weight,
        "anchor/weight_se": last.get("anchor_weight_se"),  # as of the last episode's step
        "calibration/fitted": last.get("calibrated"),
        "calibration/anchor_pairs_total": last.get("anchor_pairs_total"),
        "episodes/count": len(episodes),
    }
    # World-model exploitation monitor: calibrated-vs-real gap and rank agreement on the
    # anchor groups that completed in this step (the current policy's own samples).
    monitor = StackHandle.monitor(
        e.final_info["group_result"] for e in episodes if isinstance(e.final_info.get("group_result"), dict)
    )
    out.update({f"monitor/{k}": v for k, v in monitor.items()})
    return out


# ---------------------------------------------------------------------------------- guard
class ExploitationGuard:
    """A :data:`Callback` acting on the world-model exploitation monitor (``monitor/gap``,
    ``monitor/rank_agreement`` and ``monitor/grader_failure_rate`` in each step's metrics;
    see :mod:`wrappers.parts.monitor`).

    The monitor's values are smoothed over the last ``window`` steps that had anchor groups.
    When the smoothed gap exceeds ``max_gap``, the rank agreement falls below
    ``min_rank_agreement``, or the share of anchor members whose real outcome is unknown
    (``monitor/grader_failure_rate``: the grader failed on them, so the gap cannot see them)
    exceeds ``max_grader_failure_rate`` (default 0.25: one in four),
    ``action="raise"`` multiplies the stack's anchor fraction by ``factor`` (up to
    ``max_fraction``; more real outcomes to calibrate on), ``action="stop"`` ends
    training with a message naming what crossed which threshold, and ``action="escalate"``
    raises while it can and stops once the fraction is at ``max_fraction`` and the breach
    persists. A breach counts only once a metric has ``min_steps`` anchored steps in its
    window (1 by default: the first anchored step decides; more keeps one noisy group from
    acting). Every breach is recorded in :attr:`events` (and printed).

    :func:`train` adds one by default on a stack with anchor groups (see
    :data:`DEFAULT_GUARD` and ``GRPOLoopConfig.exploitation_guard``).

    Example::

        guard = ExploitationGuard(env, max_gap=0.15, action="raise")
        train(LLMAgent(policy, env, scaffold, config, tasks=tasks), callbacks=[guard])
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
        min_steps: int = 1,
    ) -> None:
        if action not in GUARD_ACTIONS:
            raise ValueError(f"action must be one of {GUARD_ACTIONS}, got {action!r}")
        if not 1 <= min_steps <= window:
            raise ValueError(f"min_steps must be in [1, window={window}], got {min_steps!r}")
        if max_gap is None and min_rank_agreement is None and max_grader_failure_rate is None:
            raise ValueError("ExploitationGuard needs max_gap, min_rank_agreement and/or max_grader_failure_rate")
        self.handle = StackHandle(env)
        if not self.handle.has_anchors:
            raise TypeError("ExploitationGuard needs an AnchorWrapper in the stack (the monitor reads anchor groups)")
        self.max_gap = max_gap
        self.min_rank_agreement = min_rank_agreement
        self.max_grader_failure_rate = max_grader_failure_rate
        self.action = action
        self.factor = factor
        self.max_fraction = max_fraction
        self.window = window
        self.min_steps = min_steps
        self._seen: dict[str, list[float]] = {"gap": [], "rank_agreement": [], "grader_failure_rate": []}
        self.events: list[dict[str, Any]] = []

    def _smoothed(self, metrics: dict[str, Any]) -> dict[str, float | None]:
        for key, seen in self._seen.items():
            if metrics.get(f"monitor/{key}") is not None:
                self._seen[key] = (seen + [float(metrics[f"monitor/{key}"])])[-self.window :]
        return {key: float(np.mean(seen)) if len(seen) >= self.min_steps else None for key, seen in self._seen.items()}

    def _breach(self, now: dict[str, float | None]) -> str | None:
        gap, rank, failures = now["gap"], now["rank_agreement"], now["grader_failure_rate"]
        if self.max_gap is not None and gap is not None and gap > self.max_gap:
            return f"calibrated world-model scores exceed real scores by {gap:.3f} on anchor groups (max_gap {self.max_gap})"
        if self.min_rank_agreement is not None and rank is not None and rank < self.min_rank_agreement:
            return f"world-model rank agreement on anchor groups fell to {rank:.3f} (min_rank_agreement {self.min_rank_agreement})"
        if (
            self.max_grader_failure_rate is not None
            and failures is not None
            and failures > self.max_grader_failure_rate
        ):
            return (
                f"the real outcome of {failures:.0%} of anchor members is unknown (grader failures hide them from "
                f"the gap; max_grader_failure_rate {self.max_grader_failure_rate})"
            )
        return None

    def __call__(self, step: int, metrics: dict[str, Any]) -> bool:
        breach = self._breach(self._smoothed(metrics))
        if breach is None:
            return False
        at_most = (self.handle.anchor_fraction or 0.0) >= self.max_fraction
        if self.action == "stop" or (self.action == "escalate" and at_most):
            self.events.append({"step": step, "action": "stop", "reason": breach})
            print(f"step {step}: stopping: {breach}; the policy may be exploiting the world model", flush=True)
            return True
        old = self.handle.anchor_fraction or 0.0
        new = min(self.max_fraction, old * self.factor) if old > 0 else min(self.max_fraction, 0.1)
        if new > old:
            self.handle.anchor_fraction = new
            self.events.append({"step": step, "action": "raise", "reason": breach, "fraction": new})
            print(f"step {step}: {breach}; anchor fraction {old:g} -> {new:g}", flush=True)
            self._seen = {key: [] for key in self._seen}  # judge the new fraction on fresh evidence
        return False


# ---------------------------------------------------------------------------- checkpoints
def _rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def _json_default(o: Any) -> Any:
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if hasattr(o, "to_dict"):
        return o.to_dict()
    return str(o)


def save_checkpoint(
    path: str | Path, agent: GRPOAgent, optimizer: torch.optim.Optimizer, step: int, extra: dict[str, Any]
) -> Path:
    """Write ``path/``: the agent's policy weights, the optimiser, the RNG states, the stack's
    state (``wrappers.json``) and ``trainer.json`` (``step`` + ``extra``).

    Written to a temporary directory and renamed, so a run killed mid-write keeps its
    previous checkpoint.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    agent.save_policy(tmp)
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(_rng_state(), tmp / "rng.pt")
    stack_state = StackHandle(agent.env).state_dict()
    if stack_state is not None:
        (tmp / "wrappers.json").write_text(json.dumps(stack_state, default=_json_default))
    (tmp / "trainer.json").write_text(json.dumps({"step": step, **extra}, default=_json_default))
    if path.exists():
        old = path.with_name(path.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        path.rename(old)
        tmp.rename(path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(path)
    return path


def load_checkpoint(path: str | Path, agent: GRPOAgent, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    """Restore what :func:`save_checkpoint` wrote; returns ``trainer.json`` (``step``, ...)."""
    path = Path(path)
    if not (path / "trainer.json").is_file():
        raise FileNotFoundError(f"{path} is not a checkpoint (no trainer.json)")
    handle = StackHandle(agent.env)
    saved_stack = (path / "wrappers.json").is_file()
    if saved_stack != handle.has_state:
        saved, now = ("a world-model stack", "a bare env") if saved_stack else ("a bare env", "a world-model stack")
        raise ValueError(
            f"{path} was saved from {saved} but this env is {now}: resume with the stack it was saved with"
        )
    agent.load_policy(path)
    if optimizer is not None:
        optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
    _set_rng_state(torch.load(path / "rng.pt", weights_only=False))
    if saved_stack:
        handle.load_state_dict(json.loads((path / "wrappers.json").read_text()))
    return json.loads((path / "trainer.json").read_text())


class _Logger:
    """``metrics.jsonl`` and TensorBoard events in ``output_dir`` (nothing without one)."""

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


def _cpu_seconds() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


# ---------------------------------------------------------------------------------- loop
def train(
    agent: GRPOAgent,
    *,
    callbacks: Sequence[Callback] = (),
    resume: bool | str | Path = False,
    run_info: dict[str, Any] | None = None,
) -> TrainResult:
    """Train ``agent``'s policy with GRPO in ``agent.env`` for ``agent.config.total_steps`` steps.

    Args:
        agent: a :class:`GRPOAgent` (:class:`agents.llm.LLMAgent`, :class:`agents.vla.VLAAgent`).
        callbacks: called after each step with ``(step, metrics)``; ``True`` stops training
            (a checkpoint is written first).
        resume: ``True`` resumes from ``output_dir/checkpoint`` if present; a path resumes
            from that checkpoint.
        run_info: what built the run (policy, stack, ...), saved in every checkpoint's
            ``trainer.json`` under ``setup`` so the checkpoint describes itself.

    Warns:
        NoLearningSignalWarning: ``no_signal_patience`` steps in a row without a group whose
            members' rewards differ (the updates change nothing).
        CorrectionsIdleWarning: a calibrated stack whose remaining steps cannot collect the
            anchor pairs of the first isotonic fit.
    """
    config, handle = agent.config, StackHandle(agent.env)
    out_dir = Path(config.output_dir) if config.output_dir else None
    optimizer = torch.optim.AdamW(agent.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    random.seed(config.seed)
    np.random.seed(config.seed)
    torch.manual_seed(config.seed)
    saved = _resume(agent, optimizer, resume, out_dir)
    start_step, real_total = int(saved.get("step") or 0), int(saved.get("real_executions_total") or 0)
    result = TrainResult(last_step=start_step, start_step=start_step)
    watch = SignalWatch(min(config.no_signal_patience, max(1, config.total_steps - start_step)))
    if saved.get("best_valid_rate") is not None:  # a collapse after a resume is still named one
        rate, at = saved["best_valid_rate"]
        watch.best_valid = (float(rate), int(at))
    rollback = FormatRollback(
        out_dir / "last_valid_policy" if out_dir else None, max_rollbacks=config.max_rollbacks,
        rollbacks=int(saved.get("rollbacks") or 0),
    )  # fmt: skip
    idle = handle.corrections_idle(config.total_steps - start_step, config.groups_per_step, config.group_size)
    if idle is not None:
        result.warnings.append(idle)
        warnings.warn(idle, CorrectionsIdleWarning, stacklevel=2)
    callbacks = list(callbacks)
    # a local anchor layer (a remote stack's fraction is the server's to set)
    guarded = any(isinstance(c, ExploitationGuard) for c in callbacks)
    default_guard = None
    if config.exploitation_guard and handle.anchor_fraction is not None and not guarded:
        default_guard = ExploitationGuard(agent.env, **DEFAULT_GUARD)
        callbacks.insert(0, default_guard)
    logger = _Logger(out_dir, config.tensorboard)
    steps = range(start_step, config.total_steps)
    bar = tqdm(steps, initial=start_step, total=config.total_steps, desc="GRPO", disable=not config.progress)
    try:
        for step in bar:
            t_step = time.perf_counter()
            rng = np.random.default_rng([config.seed, step])
            groups = agent.select(step, rng)
            handle.begin_step([group_id for group_id, _ in groups])
            counters_before = handle.counters()
            episodes, collect_metrics = agent.collect(groups, rng)

            # The weight once the whole rollout is over (every anchor group of the step
            # observed), not the one in some episode's final info.
            anchor_weight = handle.anchor_weight
            adv = group_advantages(
                [e.reward for e in episodes],
                [e.group_id for e in episodes],
                sources=[e.source for e in episodes],
                anchor_weight=anchor_weight,
                scale_by_std=config.scale_by_std,
            )
            # Zero-advantage members carry no policy gradient: skipping them saves their pass.
            used = [(e, a) for e, a in zip(episodes, adv.advantages) if a is not None and a != 0.0]
            agent_metrics = agent.step_metrics(episodes)
            t_update, cpu_update = time.perf_counter(), _cpu_seconds()
            # the policy that wrote this step's replies, before the update moves it
            rollback.observe(step + 1, agent_metrics, agent, optimizer)
            _set_learning_rate(optimizer, config, rollback.rollbacks)
            loss_metrics = agent.update([e for e, _ in used], [a for _, a in used], optimizer, rng) if used else {}
            update_wall, update_cpu = time.perf_counter() - t_update, _cpu_seconds() - cpu_update

            real_step = _real_executions(handle, counters_before, episodes)
            real_total += real_step
            s = adv.stats
            metrics = {
                **step_metrics(episodes, anchor_weight),
                **agent_metrics,
                **loss_metrics,
                "groups/used": s.groups_used,
                "groups/skipped": s.groups_skipped,
                "groups/degenerate": s.groups_degenerate,
                "groups/no_signal_share": s.groups_degenerate / s.groups_used if s.groups_used else None,
                "groups/anchor": s.anchor_groups,
                "real_executions/step": real_step,
                "real_executions/total": real_total,
                **collect_metrics,
                **_grading_seconds(handle, counters_before),
                "time/update_wall": update_wall,
                "time/update_cpu": update_cpu,
                "time/step_wall": time.perf_counter() - t_step,
                "memory/peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
            no_signal = watch.update(step + 1, metrics)
            if no_signal is not None:
                restored = rollback.restore(step + 1, agent, optimizer) if watch.collapsed else None
                if restored is not None:
                    lr_before = optimizer.param_groups[0]["lr"]
                    restored += f", learning rate {lr_before:g} -> {_set_learning_rate(optimizer, config, rollback.rollbacks):g}"
                    no_signal = watch.message(step + 1, rolled_back=restored)
                    result.rollbacks.append(restored)
                    watch.reset()  # the restored policy is judged afresh
                result.warnings.append(no_signal)
                warnings.warn(no_signal, NoLearningSignalWarning, stacklevel=2)
            metrics["train/rollbacks"] = rollback.rollbacks
            metrics["train/learning_rate"] = optimizer.param_groups[0]["lr"]
            logger.log(step + 1, metrics)
            result.history.append({"step": step + 1, **metrics})
            result.last_step = step + 1
            result.steps_without_signal = watch.steps_without_signal
            reward = metrics["reward/mean"]
            bar.set_postfix(reward="n/a" if reward is None else f"{reward:.3f}", w=f"{anchor_weight:.2f}")

            extra = {
                "config": asdict(config),
                "real_executions_total": real_total,
                "best_valid_rate": watch.best_valid,
                "rollbacks": rollback.rollbacks,
                "setup": run_info or {},
            }
            done = step + 1 == config.total_steps
            every = config.checkpoint_every > 0 and (step + 1) % config.checkpoint_every == 0
            if out_dir is not None and (done or every):
                save_checkpoint(out_dir / "checkpoint", agent, optimizer, step + 1, extra)
            if any(cb(step + 1, metrics) for cb in callbacks):
                if out_dir is not None and not (done or every):
                    save_checkpoint(out_dir / "checkpoint", agent, optimizer, step + 1, extra)
                break
    finally:
        bar.close()
        logger.close()
        rollback.close()
        if default_guard is not None:  # what the guard nobody asked for did, where the caller will look
            result.warnings += [
                f"exploitation guard, step {e['step']}: {e['action']}: {e['reason']}" for e in default_guard.events
            ]
    return result


def _resume(
    agent: GRPOAgent, optimizer: torch.optim.Optimizer, resume: bool | str | Path, out_dir: Path | None
) -> dict[str, Any]:
    """The restored checkpoint's ``trainer.json`` (``step``, ``real_executions_total``, ...),
    or ``{}`` when there is nothing to resume."""
    if isinstance(resume, (str, Path)):
        checkpoint: Path | None = Path(resume)
        if not (Path(resume) / "trainer.json").is_file():
            raise FileNotFoundError(f"resume: no checkpoint at {checkpoint}")
    else:
        checkpoint = out_dir / "checkpoint" if out_dir and resume else None
    if checkpoint is not None and (checkpoint / "trainer.json").is_file():
        return load_checkpoint(checkpoint, agent, optimizer)
    return {}


def _set_learning_rate(optimizer: torch.optim.Optimizer, config: GRPOLoopConfig, rollbacks: int) -> float:
    """Set and return the rate of the next optimiser step: ``learning_rate``, times
    ``rollback_lr_factor`` per rollback, times the linear warmup over ``warmup_steps``."""
    steps = max((int(state["step"]) for state in optimizer.state.values() if "step" in state), default=0)
    warmup = 1.0 if config.warmup_steps == 0 else min(1.0, (steps + 1) / config.warmup_steps)
    lr = config.learning_rate * config.rollback_lr_factor**rollbacks * warmup
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


def _real_executions(handle: StackHandle, before: dict[str, Any] | None, episodes: Sequence[Any]) -> int:
    """Real executions of this step: the world-model layer counts them; a bare env grades
    every step that asked for a grading."""
    if before is None:
        return sum(e.graded_steps for e in episodes)
    now = handle.counters()
    assert now is not None  # a stack with counters before has them after
    return int(now["real_executions"] - before["real_executions"])


def _grading_seconds(handle: StackHandle, before: dict[str, Any] | None) -> dict[str, float]:
    now = handle.counters()
    if before is None or now is None:
        return {}
    return {
        "time/real_grading_s": now["real_seconds"] - before["real_seconds"],
        "time/wm_grading_s": now["wm_seconds"] - before["wm_seconds"],
    }
