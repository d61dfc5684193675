"""``ablation``: no correction / denoising only / debiasing only / both, measured where the paper makes its claims.

The paper claims that Online Debiasing and Inverse-Variance Denoising bring the *policy
gradient* of world-model training closer to the real-execution gradient and so reach a
better score. This experiment measures exactly that, in a model small enough to run on CPU
with the true outcome of every sample known:

**The policy.** A softmax policy over each task's logged solutions (the AutoResearch pool
execution logs: 37 executed solutions per task, from ~47 solution templates such as
``knn_5``, ``rf_100``, ``hgb_default`` or ``broken_timeout``). Its parameters are one logit
per solution *template*, shared by every task that has a solution of that template:
``pi(s | task) = softmax over the task's solutions of theta[template(s)]``. A GRPO member is a
draw of one solution from ``pi(. | task)``; its true reward is the logged executed score, its
world-model reward the world model's score of the same solution. Because the logit table is
shared, what the policy learns on some tasks transfers to others (hist-gradient boosting is
good on most tables, a script that reads private answers fails everywhere), so a score on
*held-out tasks* is meaningful.

**Tasks.** The policy trains on the logs of ``train_split`` tasks (default ``test``: tasks the
shipped learned world model was never fitted on, so its errors are out-of-sample, as they are
on a policy's fresh samples) and is scored on ``eval_split`` tasks (default ``train``: tasks
the policy never trained on). ``tier`` picks the catalog tier(s) whose logs are used
(``small``; ``full`` / ``all`` once the full-size tier's pool logs exist).

**Variants.** Each step draws ``groups_per_step`` groups of ``group_size`` members; a seeded
:class:`~wrappers.AnchorScheduler` picks the anchor groups (same seed, same anchor slots for
every variant), whose rewards are the true scores; every other group is rewarded with the
world-model scores as the shipped :class:`~wrappers.Calibrator` transforms them, and anchor
advantages are multiplied by its :attr:`~wrappers.Calibrator.anchor_weight`:

* ``none``: ``CalibrationConfig(debias=False, denoise=False)``: the uncorrected mixture;
* ``denoise``: ``CalibrationConfig(debias=False, denoise=True)``;
* ``debias``: ``CalibrationConfig(debias=True, denoise=False)``;
* ``both``: ``CalibrationConfig(debias=True, denoise=True)`` (WMRL);
* ``wm-only``: no anchors, every group rewarded by the raw world model (reference);
* ``real``: every group rewarded by real execution (reference: plain GRPO).

Each step begins with :meth:`~wrappers.Calibrator.begin_step` (where a due refit happens) and
ends by feeding every complete anchor group to :meth:`~wrappers.Calibrator.observe_group`,
the same calls the wrappers make. Advantages come from :func:`agents.grpo.group_advantages`
(std-scaled GRPO and centring-only Dr.GRPO, both run), the loss from :func:`agents.grpo.grpo_loss`.
World models: ``learned`` = the shipped :class:`~wmrl_envs.world_models.CodeOutcomeModel`;
``noisy-oracle`` = :class:`~wmrl_envs.world_models.NoisyOracle` (the logged truth through a
known bias ``oracle_bias`` plus fresh Gaussian noise ``oracle_sigma`` on every draw).

**Measure (a): gradient error.** At fixed policy parameters (``gradient_states``: the policy
after that many steps of real-execution GRPO from the uniform policy), a stream of
``gradient_warmup`` + ``gradient_batches`` batches is drawn; the calibrators learn along it
and the last ``gradient_batches`` are measured. The reference is the *population*
real-execution gradient ``g* = E[g_real]`` of the same estimator (same normalisation, same
token-mean aggregation over members with a non-zero advantage, as the trainer does),
estimated from ``reference_batches`` independent real-execution batches. An overall scale of
the gradient is a step-size choice (and Adam, like the trainer's AdamW, undoes it), so the
two headline numbers are scale-free:

* ``grad_err``: the error of one batch's gradient at the best step size,
  ``min_a E||a g - g*||^2 / ||g*||^2 = 1 - E[g.g*]^2 / (E||g||^2 ||g*||^2)`` (bias and variance
  together; the ``real`` row is the sampling noise of real execution itself);
* ``grad_dir_bias``: the error floor that averaging over batches does not remove, the
  direction error of the mean gradient ``1 - cos^2(E g, g*)``;

plus ``grad_bias2`` = ``||E g - g*||^2 / ||g*||^2`` at the trainer's own scale (the anchor weight
also raises the step size by ``1 + (w - 1) * anchor share``), and, in the JSON, the raw
relative MSE and the mean cosine. Noise of the Monte Carlo mean is subtracted from both bias
numbers (``tr Cov / M``).

**Measure (b): score after training.** From the uniform policy, ``steps`` GRPO steps (Adam,
``learning_rate``) on each variant's rewards; the score is the policy's exact expected true
score ``sum_s pi(s | task) r(s)``, averaged over tasks, over ``seeds``. The headline is the
score on the *training* tasks: it is the objective GRPO maximises there, and those tasks are
unseen by the learned world model. The score on the held-out ``eval_split`` tasks is reported
too, with a caveat: the shipped learned world model was fitted on exactly those tasks (the
catalog's train split; no third split with logs exists), so for ``learned`` it measures how
well the world model's preferences, learned on those tasks, transfer back to them, not only
how well the policy generalises. For ``noisy-oracle`` it is clean. ``steps`` is long enough
(600) for the policies to approach what their reward stream leads to; short runs mostly
measure early learning speed, where a smooth, template-consistent world-model signal can even
beat the true one.

Classes: :class:`AblationConfig`, :class:`LoggedTasks`, :class:`SoftmaxPolicy`.
Functions: :func:`run`, :func:`load_tasks`, :func:`policy_gradient`, :func:`gradient_error`,
:func:`train_variant`, :func:`tables`.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from agents.grpo import group_advantages, grpo_loss
from agents.grpo.diagnostics import CorrectionsIdleWarning
from agents.llm.loading import load_world_model
from benchmarks.common import save_figure, summarize_seeds
from benchmarks.report import machine_summary, markdown_table, write_results
from wmrl_envs.config_cli import config_to_dict
from wrappers import AnchorScheduler, CalibrationConfig, Calibrator
from wrappers.handle import anchors_per_step, corrections_budget
from wrappers.parts.scheduling import informative_priority

__all__ = [
    "AblationConfig",
    "CONFIG",
    "VARIANTS",
    "NORMALISATIONS",
    "LoggedTasks",
    "SoftmaxPolicy",
    "load_tasks",
    "policy_gradient",
    "gradient_error",
    "train_variant",
    "run",
    "tables",
]

NAME = "ablation"

#: Correction variants (the paper's expected order of quality), then the two references.
VARIANTS = ("none", "denoise", "debias", "both", "wm-only", "real")
#: ``(debias, denoise)`` of the calibrated variants.
_SWITCHES = {"none": (False, False), "denoise": (False, True), "debias": (True, False), "both": (True, True)}
WORLD_MODELS = ("learned", "noisy-oracle")
#: Advantage normalisations: GRPO's std scaling and Dr.GRPO's centring only.
NORMALISATIONS = ("std", "centred")

#: A world model for the ablation: scores of a task's solutions (local indices) -> list of scores.
Scorer = Callable[[str, np.ndarray], list]


@dataclass
class AblationConfig:
    """Knobs of the ablation (defaults: the paper's calibration constants; about 6 min on 2 cores).

    Attributes:
        world_models: world models to ablate: ``learned`` and/or ``noisy-oracle``.
        seeds: seeds (sampling, anchors, oracle noise, training); mean and spread over them.
        normalisations: advantage normalisations: ``std`` (GRPO) and/or ``centred`` (Dr.GRPO).
        tier: catalog tier whose pool logs are used: ``small``, ``full`` or ``all``.
        train_split: catalog split of the tasks the policy trains (and gradients are measured) on.
        eval_split: catalog split of the held-out tasks the trained policy is scored on.
        tasks: explicit training task ids (none = every logged task of ``train_split``).
        groups_per_step: GRPO groups per step.
        group_size: members per group (draws from the policy on one task).
        anchor_fraction: target share of anchor groups.
        anchor_min_per_step: floor of anchor groups per step.
        anchor_selection: ``random`` (the paper's: anchors drawn before the members are
            sampled) or ``informative`` (after: at random among the groups whose members
            drew >= 2 distinct solutions; see :class:`~wrappers.VectorAnchorWrapper`).
        steps: training steps of measure (b) (the score is read after the last one).
        learning_rate: Adam step size of the softmax policy's logits.
        gradient_states: policies of measure (a): after this many real-execution GRPO steps.
        gradient_warmup: batches the calibrators learn on before measure (a) starts.
        gradient_batches: measured batches of measure (a), per policy state.
        reference_batches: real-execution batches estimating the population gradient.
        calibration_start_pairs: pairs before the first isotonic fit (paper: 200).
        calibration_start_rule: ``count`` (paper: fit at ``calibration_start_pairs``) or ``cv``
            (fit once the map's cross-validated error beats the identity's; see CalibrationConfig).
        calibration_refit_every: refit after this many new pairs (paper: 64).
        calibration_half_life: EMA half-life of the disagreement (paper: 64).
        calibration_freeze_after: anchor groups observed before the weight's scale freezes (paper: 32).
        weighter_start: ``after-fit`` (default) or ``first-anchor`` (see CalibrationConfig).
        oracle_bias: bias of the noisy oracle: ``identity``, ``quadratic`` or ``power:<k>`` (r -> r^k).
        oracle_sigma: noise standard deviation of the noisy oracle.
        logs: execution-log JSONL files (none = the shipped pool logs).
        learned_model: ``default`` or a saved CodeOutcomeModel directory.
    """

    world_models: tuple[str, ...] = WORLD_MODELS
    seeds: tuple[int, ...] = (0, 1, 2)
    normalisations: tuple[str, ...] = NORMALISATIONS
    tier: str = "small"
    train_split: str = "test"
    eval_split: str = "train"
    tasks: tuple[str, ...] | None = None
    groups_per_step: int = 10
    group_size: int = 4
    anchor_fraction: float = 0.10
    anchor_min_per_step: int = 1
    anchor_selection: str = "random"
    steps: int = 600
    learning_rate: float = 0.01
    gradient_states: tuple[int, ...] = (0, 100)
    gradient_warmup: int = 300
    gradient_batches: int = 400
    reference_batches: int = 4000
    calibration_start_pairs: int = 200
    calibration_start_rule: str = "count"
    calibration_refit_every: int = 64
    calibration_half_life: float = 64.0
    calibration_freeze_after: int = 32
    weighter_start: str = "after-fit"
    oracle_bias: str = "quadratic"
    oracle_sigma: float = 0.15
    logs: tuple[str, ...] | None = None
    learned_model: str = "default"

    def __post_init__(self) -> None:
        bad = [w for w in self.world_models if w not in WORLD_MODELS]
        if bad or not self.world_models:
            raise ValueError(f"world_models must be a non-empty subset of {WORLD_MODELS}, got {self.world_models!r}")
        if not self.normalisations or any(n not in NORMALISATIONS for n in self.normalisations):
            raise ValueError(
                f"normalisations must be a non-empty subset of {NORMALISATIONS}, got {self.normalisations!r}"
            )
        for name in ("steps", "groups_per_step", "gradient_batches", "reference_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.gradient_warmup < 0 or any(s < 0 for s in self.gradient_states):
            raise ValueError("gradient_warmup and gradient_states must be >= 0")
        if self.group_size < 2:
            raise ValueError("group_size must be >= 2 (GRPO advantages need two members)")
        if self.tier not in ("small", "full", "all"):
            raise ValueError(f"tier must be 'small', 'full' or 'all', got {self.tier!r}")
        for name in ("train_split", "eval_split"):
            if getattr(self, name) not in ("train", "test"):
                raise ValueError(f"{name} must be 'train' or 'test', got {getattr(self, name)!r}")
        CalibrationConfig(weighter_start=self.weighter_start, start_rule=self.calibration_start_rule)  # validates them
        if self.anchor_selection not in ("random", "informative"):
            raise ValueError(f"anchor_selection must be 'random' or 'informative', got {self.anchor_selection!r}")
        if not (self.oracle_bias in ("identity", "quadratic") or self.oracle_bias.startswith("power:")):
            raise ValueError(f"oracle_bias must be 'identity', 'quadratic' or 'power:<k>', got {self.oracle_bias!r}")

    def idle_corrections(self) -> str | None:
        """Why the corrections cannot engage within ``steps`` (too few anchor pairs for the
        first isotonic fit), or ``None``; the four correction variants then coincide."""
        text = corrections_budget(
            start_pairs=self.calibration_start_pairs,
            pairs_seen=0,
            steps=self.steps,
            anchors_per_step=anchors_per_step(self.anchor_fraction, self.anchor_min_per_step, self.groups_per_step),
            group_size=self.group_size,
        )
        if text is None:
            return None
        return (
            f"measure (b), {self.steps} steps: {text} (--steps, --anchor-fraction, --calibration-start-pairs). "
            "The none/denoise/debias/both variants will be identical"
        )

    def calibration(self, debias: bool, denoise: bool) -> CalibrationConfig:
        """The :class:`~wrappers.CalibrationConfig` of a calibrated variant."""
        return CalibrationConfig(
            start_pairs=self.calibration_start_pairs, refit_every=self.calibration_refit_every,
            max_pairs=max(5000, self.calibration_start_pairs), half_life=self.calibration_half_life,
            freeze_after=self.calibration_freeze_after, weighter_start=self.weighter_start,
            start_rule=self.calibration_start_rule, debias=debias, denoise=denoise,
        )  # fmt: skip


CONFIG = AblationConfig


# ------------------------------------------------------------------ logged tasks and the policy
class LoggedTasks:
    """Logged solutions with known true scores, by task, over a shared template vocabulary.

    Args:
        by_task: ``{task_id: [LogRecord, ...]}`` (records with a known score).
        vocabulary: template ids (``solution_id``) in parameter order; default: sorted ids seen.

    Attributes:
        records / true / ids: per task, the records, their true scores and their template
            indices into :attr:`vocabulary`.
    """

    def __init__(self, by_task: Mapping[str, Sequence[Any]], vocabulary: Sequence[str] | None = None) -> None:
        self.records = {t: list(rs) for t, rs in by_task.items()}
        self.vocabulary = (
            list(vocabulary)
            if vocabulary is not None
            else sorted({_template(r) for rs in by_task.values() for r in rs})
        )
        index = {v: i for i, v in enumerate(self.vocabulary)}
        self.true = {t: np.array([r.outcome.score for r in rs], dtype=float) for t, rs in self.records.items()}
        self.ids = {t: np.array([index.get(_template(r), -1) for r in rs]) for t, rs in self.records.items()}
        for t, ids in self.ids.items():
            if (ids < 0).any():
                raise ValueError(f"task {t!r} has solutions outside the vocabulary")

    @property
    def tasks(self) -> list[str]:
        return list(self.records)

    def with_vocabulary(self, vocabulary: Sequence[str]) -> LoggedTasks:
        """The same tasks indexed by ``vocabulary`` (solutions of unknown templates are dropped)."""
        keep = set(vocabulary)
        return LoggedTasks({t: [r for r in rs if _template(r) in keep] for t, rs in self.records.items()}, vocabulary)


def _template(record: Any) -> str:
    return record.solution_id or record.code


class SoftmaxPolicy:
    """``pi(s | task) = softmax(theta[template(s)])`` over the task's logged solutions.

    >>> import torch
    >>> p = SoftmaxPolicy(3)
    >>> p.probs(np.array([0, 2])).tolist()
    [0.5, 0.5]
    """

    def __init__(self, n_params: int) -> None:
        import torch

        self.theta = torch.zeros(n_params, dtype=torch.float64, requires_grad=True)

    def logits(self, ids: np.ndarray) -> np.ndarray:
        return self.theta.detach().numpy()[ids]

    def probs(self, ids: np.ndarray) -> np.ndarray:
        z = self.logits(ids)
        e = np.exp(z - z.max())
        return e / e.sum()

    def sample(self, ids: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` i.i.d. draws (local solution indices) from ``pi(. | task)``."""
        return rng.choice(len(ids), size=n, p=self.probs(ids))

    def expected_score(self, tasks: LoggedTasks) -> float:
        """Mean over tasks of ``sum_s pi(s | task) r(s)``: the exact expected true score."""
        return float(np.mean([self.probs(tasks.ids[t]) @ tasks.true[t] for t in tasks.tasks]))


def load_tasks(config: AblationConfig) -> tuple[LoggedTasks, LoggedTasks]:
    """``(train, eval)`` logged tasks for ``config`` (eval indexed by the train vocabulary)."""
    from wmrl_envs.autoresearch import catalog_split
    from wmrl_envs.world_models import read_logs

    if config.logs:
        paths = [Path(p) for p in config.logs]
    else:
        from wmrl_envs.autoresearch.leaderboard import logs_root

        paths = sorted(logs_root().glob("*.jsonl"))
        if not paths:
            raise FileNotFoundError(f"no shipped pool logs in {logs_root()}; build them (wmrl-tasks) or pass --logs")
    split = catalog_split(None if config.tier == "all" else config.tier)
    records = [r for r in read_logs(paths) if r.known]
    groups: dict[str, dict[str, list[Any]]] = {}
    for role, name in (("train", config.train_split), ("eval", config.eval_split)):
        keep = set(config.tasks) if role == "train" and config.tasks else set(split[name])
        by_task: dict[str, list[Any]] = {}
        for r in records:
            if r.task_id in keep:
                by_task.setdefault(r.task_id, []).append(r)
        groups[role] = {t: rs for t, rs in sorted(by_task.items()) if len({_template(r) for r in rs}) >= 2}
        if not groups[role]:
            raise ValueError(
                f"no logged {role} task with >= 2 scored solutions (split {name!r}, tier {config.tier!r}, {len(paths)} log files)"
            )
    train = LoggedTasks(groups["train"])
    return train, LoggedTasks(groups["eval"]).with_vocabulary(train.vocabulary)


# ------------------------------------------------------------------ world models
def learned_scores(model: Any, tasks: LoggedTasks) -> dict[str, list[float | None]]:
    """The learned world model's score of every logged solution (it is deterministic: once)."""
    out = {}
    for t, rs in tasks.records.items():
        outcomes = model.predict([r.context for r in rs], [r.code for r in rs])
        out[t] = [None if o is None else o.score for o in outcomes]
    return out


def _scorer(
    wm_name: str, config: AblationConfig, tasks: LoggedTasks, seed: int, learned: Mapping[str, list] | None
) -> Scorer:
    """``score(task, picks)`` -> the world model's scores of those solutions (``None`` = unknown).
    ``learned``: :func:`learned_scores` (for ``wm_name="learned"``)."""
    if wm_name == "learned":
        assert learned is not None
        return lambda task, picks: [learned[task][int(i)] for i in picks]
    from wmrl_envs.world_models import LoggedOutcomes, NoisyOracle

    oracle = NoisyOracle(
        LoggedOutcomes([r for rs in tasks.records.values() for r in rs]),
        bias=oracle_bias(config.oracle_bias),
        sigma=config.oracle_sigma,
        seed=seed,
    )

    def score(task: str, picks: np.ndarray) -> list:
        rs = [tasks.records[task][int(i)] for i in picks]
        return [None if o is None else o.score for o in oracle.predict([r.context for r in rs], [r.code for r in rs])]

    return score


def oracle_bias(name: str) -> str | Callable[[Any], Any]:
    """A :data:`~wmrl_envs.world_models.BIAS_PRESETS` name, or ``power:<k>``: ``r -> r ** k``
    (a strongly non-linear monotone bias, which GRPO's centring and std scaling cannot cancel).

    >>> oracle_bias("power:4")(0.5)
    0.0625
    """
    if name.startswith("power:"):
        k = float(name.split(":", 1)[1])
        if not k > 0:
            raise ValueError(f"power bias needs k > 0, got {name!r}")
        return lambda r: r**k
    return name


# ------------------------------------------------------------------ one batch through a variant
@dataclass
class _Batch:
    """One GRPO step's draws: per group its task, picks, true and world-model scores; the anchors."""

    tasks: list[str]
    picks: list[np.ndarray]
    true: list[list[float]]
    wm: list[list[float | None]]
    anchors: frozenset


def _draw(
    policy: SoftmaxPolicy,
    tasks: LoggedTasks,
    scorer: Scorer | None,
    scheduler: AnchorScheduler | None,
    config: AblationConfig,
    rng: np.random.Generator,
) -> _Batch:
    names = tasks.tasks
    chosen = [names[int(i)] for i in rng.integers(len(names), size=config.groups_per_step)]
    picks = [policy.sample(tasks.ids[t], config.group_size, rng) for t in chosen]
    true = [tasks.true[t][p].tolist() for t, p in zip(chosen, picks)]
    wm: list[list[float | None]] = [
        scorer(t, p) if scorer is not None else [None] * len(p) for t, p in zip(chosen, picks)
    ]
    anchors: frozenset = frozenset()
    if scheduler is not None:
        gids = list(range(config.groups_per_step))
        if config.anchor_selection == "informative":  # decided after the draws, as the vector anchor layer does
            scheduler.defer(gids)
            anchors = scheduler.decide({g: informative_priority([(int(i), None) for i in picks[g]]) for g in gids})
        else:
            anchors = scheduler.begin_step(gids)
        for g in gids:
            scheduler.release(g)
    return _Batch(chosen, picks, true, wm, anchors)


class _Arm:
    """A variant's reward stream: its calibrator (calibrated variants) and what it rewards with."""

    def __init__(self, name: str, config: AblationConfig) -> None:
        self.name = name
        self.calibrator = Calibrator(config.calibration(*_SWITCHES[name])) if name in _SWITCHES else None
        self.fitted_at: int | None = None

    @property
    def weight(self) -> float:
        return self.calibrator.anchor_weight if self.calibrator is not None else 1.0

    def begin_step(self, step: int) -> None:
        if self.calibrator is not None:
            self.calibrator.begin_step()
            if self.fitted_at is None and self.calibrator.debiaser.fitted:
                self.fitted_at = step

    def rewards(self, batch: _Batch) -> tuple[list[float | None], list[int], list[str]]:
        rewards: list[float | None] = []
        gids: list[int] = []
        sources: list[str] = []
        for g, (true, wm) in enumerate(zip(batch.true, batch.wm)):
            real = self.name == "real" or (self.name != "wm-only" and g in batch.anchors)
            scores: list[float | None]
            if real:
                scores = list(true)
            elif self.calibrator is not None:
                scores = self.calibrator.transform(wm)
            else:
                scores = list(wm)
            rewards += scores
            gids += [g] * len(true)
            sources += ["env" if real else "wm"] * len(true)
        return rewards, gids, sources

    def advantages(self, batch: _Batch, normalisation: str) -> list[float | None]:
        rewards, gids, sources = self.rewards(batch)
        weight = self.weight if self.name != "real" else 1.0
        return group_advantages(
            rewards, gids, sources=sources, anchor_weight=weight, scale_by_std=normalisation == "std"
        ).advantages

    def end_step(self, batch: _Batch) -> None:
        """Feed the step's complete anchor groups to the calibrator (as the wrappers do)."""
        if self.calibrator is None:
            return
        for g in sorted(batch.anchors):
            self.calibrator.observe_group(batch.wm[g], batch.true[g])


def policy_gradient(tasks: LoggedTasks, batch: _Batch, advantages: Sequence[float | None], n_params: int) -> np.ndarray:
    """The ascent direction of :func:`agents.grpo.grpo_loss` (token-mean, one action token per
    member, on-policy ratio 1) over the members with a non-zero advantage, as the trainer
    keeps them: ``(1 / D) sum_i A_i grad log pi(s_i | task_i)``. Within a group the advantages
    sum to zero, so the ``- pi(. | task)`` part of ``grad log pi`` cancels and the gradient is
    ``(1 / D) sum_i A_i e_{template(s_i)}`` (checked against autograd in the tests)."""
    grad = np.zeros(n_params)
    used = 0
    k = 0
    for t, picks in zip(batch.tasks, batch.picks):
        for p in picks:
            a = advantages[k]
            k += 1
            if a is None or a == 0.0:
                continue
            grad[tasks.ids[t][int(p)]] += a
            used += 1
    return grad / used if used else grad


def _loss(policy: SoftmaxPolicy, tasks: LoggedTasks, batch: _Batch, advantages: Sequence[float | None]) -> Any:
    """:func:`agents.grpo.grpo_loss` of the batch's members with a non-zero advantage (or ``None``)."""
    import torch

    rows, adv = [], []
    k = 0
    for t, picks in zip(batch.tasks, batch.picks):
        ids = torch.as_tensor(tasks.ids[t])
        logp = torch.log_softmax(policy.theta[ids], dim=0)
        for p in picks:
            a = advantages[k]
            k += 1
            if a is not None and a != 0.0:
                rows.append(logp[int(p)])
                adv.append(a)
    if not rows:
        return None
    lp = torch.stack(rows).unsqueeze(1)
    ones = torch.ones_like(lp)
    return grpo_loss(lp, lp.detach(), torch.tensor(adv, dtype=lp.dtype), ones).loss


# ------------------------------------------------------------------ measure (b): training
def train_variant(
    variant: str,
    config: AblationConfig,
    train: LoggedTasks,
    evaluate: LoggedTasks,
    scorer: Scorer | None,
    seed: int,
    normalisation: str,
    *,
    record_every: int = 10,
) -> dict[str, Any]:
    """Train a fresh softmax policy for ``config.steps`` GRPO steps on ``variant``'s rewards."""
    import torch

    policy = SoftmaxPolicy(len(train.vocabulary))
    optimizer = torch.optim.Adam([policy.theta], lr=config.learning_rate)
    rng = np.random.default_rng([seed, 11])
    anchors = variant not in ("wm-only", "real")
    scheduler = AnchorScheduler(config.anchor_fraction, config.anchor_min_per_step, seed=seed) if anchors else None
    arm = _Arm(variant, config)
    curve = [(0, policy.expected_score(evaluate), policy.expected_score(train))]
    anchor_groups = informative_groups = 0
    for step in range(config.steps):
        arm.begin_step(step)
        batch = _draw(policy, train, scorer if variant != "real" else None, scheduler, config, rng)
        for g in batch.anchors:
            anchor_groups += 1
            informative_groups += _spread(batch.true[g]) and _spread(batch.wm[g])
        loss = _loss(policy, train, batch, arm.advantages(batch, normalisation))
        if loss is not None:
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        arm.end_step(batch)
        if (step + 1) % record_every == 0 or step + 1 == config.steps:
            curve.append((step + 1, policy.expected_score(evaluate), policy.expected_score(train)))
    return {
        "heldout_score": curve[-1][1],
        "train_score": curve[-1][2],
        "final_weight": arm.weight,
        "fitted_at_step": arm.fitted_at,
        "informative_anchor_share": informative_groups / anchor_groups if anchor_groups else None,
        "curve": curve,
        "theta": policy.theta.detach().numpy().copy(),
    }


def _spread(scores: Sequence[float | None]) -> bool:
    """Whether a group's known scores differ (what an anchor group needs to teach anything)."""
    known = [x for x in scores if x is not None]
    return len(known) >= 2 and max(known) - min(known) > 1e-9


# ------------------------------------------------------------------ measure (a): gradient error
def _reference(
    policy: SoftmaxPolicy,
    tasks: LoggedTasks,
    config: AblationConfig,
    normalisations: Sequence[str],
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """Population real-execution gradient per normalisation (Monte Carlo over real batches)."""
    real = _Arm("real", config)
    n = len(tasks.vocabulary)
    sums = {norm: np.zeros(n) for norm in normalisations}
    for _ in range(config.reference_batches):
        batch = _draw(policy, tasks, None, None, config, rng)
        for norm in normalisations:
            sums[norm] += policy_gradient(tasks, batch, real.advantages(batch, norm), n)
    return {norm: s / config.reference_batches for norm, s in sums.items()}


def gradient_error(
    config: AblationConfig,
    tasks: LoggedTasks,
    scorer: Scorer,
    seed: int,
    policy: SoftmaxPolicy,
    reference: Mapping[str, np.ndarray],
    *,
    tag: int = 0,
) -> dict[tuple[str, str], dict[str, float]]:
    """Measure (a) at fixed ``policy``: per ``(variant, normalisation)``, the relative MSE, bias
    part and cosine of the batch gradient against the population real-execution ``reference``."""
    rng = np.random.default_rng([seed, 23, tag])
    scheduler = AnchorScheduler(config.anchor_fraction, config.anchor_min_per_step, seed=seed)
    arms = [_Arm(v, config) for v in VARIANTS]
    n = len(tasks.vocabulary)
    stats: dict[tuple[str, str], dict[str, Any]] = {
        (v, norm): {"sq": 0.0, "sum": np.zeros(n), "cos": 0.0, "dot": 0.0, "norm2": 0.0}
        for v in VARIANTS
        for norm in config.normalisations
    }
    measured = 0
    for step in range(config.gradient_warmup + config.gradient_batches):
        for arm in arms:
            arm.begin_step(step)
        batch = _draw(policy, tasks, scorer, scheduler, config, rng)
        if step >= config.gradient_warmup:
            measured += 1
            for arm in arms:
                for norm in config.normalisations:
                    g = policy_gradient(tasks, batch, arm.advantages(batch, norm), n)
                    ref = reference[norm]
                    s = stats[(arm.name, norm)]
                    s["sq"] += float(np.sum((g - ref) ** 2))
                    s["sum"] += g
                    s["dot"] += float(g @ ref)
                    s["norm2"] += float(g @ g)
                    denom = np.linalg.norm(g) * np.linalg.norm(ref)
                    s["cos"] += float(g @ ref / denom) if denom > 0 else 0.0
        for arm in arms:
            arm.end_step(batch)
    out = {}
    for (v, norm), s in stats.items():
        ref2 = float(reference[norm] @ reference[norm])
        mean = s["sum"] / measured
        # ||mean - g*||^2 overestimates ||E g - g*||^2 by the mean's own noise tr(Cov) / M: remove it.
        trace_cov = (s["norm2"] - measured * float(mean @ mean)) / max(measured - 1, 1)
        arm = next(a for a in arms if a.name == v)
        # The error at the best step size: min_a E||a g - g*||^2 / ||g*||^2 = 1 - E[g.g*]^2 / (E||g||^2 ||g*||^2).
        err = 1.0 - (s["dot"] / measured) ** 2 / (s["norm2"] / measured * ref2) if s["norm2"] > 0 else 1.0
        out[(v, norm)] = {
            "grad_err": err,
            "grad_mse": s["sq"] / measured / ref2,
            "grad_bias2": (float(np.sum((mean - reference[norm]) ** 2)) - trace_cov / measured) / ref2,
            # Direction error of the mean gradient at its best step size: 1 - cos^2(E g, g*)
            # (E||mean||^2 corrected for the mean's noise as above).
            "grad_dir_bias": 1.0
            - float(mean @ reference[norm]) ** 2 / (max(float(mean @ mean) - trace_cov / measured, 1e-300) * ref2),
            "grad_cos": s["cos"] / measured,
            "weight_at_measure": arm.weight,
        }
    return out


# ------------------------------------------------------------------ the experiment
_GRAD_METRICS = ("grad_err", "grad_dir_bias", "grad_bias2", "grad_mse", "grad_cos", "weight_at_measure")
METRICS = (*_GRAD_METRICS, "heldout_score", "train_score", "final_weight", "fitted_at_step", "informative_anchor_share")


def run(config: AblationConfig, run_dir: Path, *, progress: bool = True) -> dict[str, Any]:
    """Every seed x world model x normalisation; writes ``results.json``, ``results.md`` and plots."""
    started = time.perf_counter()
    idle = config.idle_corrections()
    if idle is not None:
        warnings.warn(idle, CorrectionsIdleWarning, stacklevel=2)
    train, evaluate = load_tasks(config)
    learned = (
        learned_scores(load_world_model(config.learned_model), train) if "learned" in config.world_models else None
    )
    rows: list[dict[str, Any]] = []
    curves: dict[str, list[list[tuple[int, float, float]]]] = {}
    per_seed = len(config.gradient_states) + len(config.world_models) * len(config.normalisations)
    bar = tqdm(total=len(config.seeds) * per_seed, desc="ablation", disable=not progress)
    for seed in config.seeds:
        # Measure (a) at the policy after k real-execution GRPO steps (k in gradient_states);
        # the population reference depends on the policy only, so it is shared by the world models.
        grads: dict[tuple[str, str, str], list[dict[str, float]]] = {}
        for k, n_steps in enumerate(config.gradient_states):
            policy = SoftmaxPolicy(len(train.vocabulary))
            if n_steps:
                trained = train_variant(
                    "real", _replace(config, steps=n_steps), train, evaluate, None, seed, config.normalisations[0]
                )
                policy.theta.data[:] = _as_tensor(trained["theta"])
            reference = _reference(policy, train, config, config.normalisations, np.random.default_rng([seed, 29, k]))
            for wm_name in config.world_models:
                scorer = _scorer(wm_name, config, train, seed, learned)
                for (variant, norm), metrics in gradient_error(
                    config, train, scorer, seed, policy, reference, tag=k
                ).items():
                    grads.setdefault((wm_name, variant, norm), []).append(metrics)
            bar.update()
        # Measure (b): train each variant from the uniform policy.
        for wm_name in config.world_models:
            for norm in config.normalisations:
                for variant in VARIANTS:
                    arm_scorer = _scorer(wm_name, config, train, seed, learned) if variant != "real" else None
                    result = train_variant(variant, config, train, evaluate, arm_scorer, seed, norm)
                    curves.setdefault(f"{wm_name}/{norm}/{variant}", []).append(result["curve"])
                    g = grads[(wm_name, variant, norm)]
                    rows.append({
                        "world_model": wm_name, "normalisation": norm, "variant": variant, "seed": seed,
                        **{m: float(np.mean([x[m] for x in g])) for m in _GRAD_METRICS},
                        "grad_by_state": g,
                        "heldout_score": result["heldout_score"], "train_score": result["train_score"],
                        "final_weight": result["final_weight"], "fitted_at_step": result["fitted_at_step"],
                        "informative_anchor_share": result["informative_anchor_share"],
                    })  # fmt: skip
                bar.update()
    bar.close()
    summary = []
    for wm_name in config.world_models:
        for norm in config.normalisations:
            mine = [r for r in rows if r["world_model"] == wm_name and r["normalisation"] == norm]
            for row in summarize_seeds(mine, "variant", METRICS):
                summary.append({"world_model": wm_name, "normalisation": norm, **row})
    uniform = SoftmaxPolicy(len(train.vocabulary))
    result = {
        "experiment": NAME,
        "config": config_to_dict(config),
        "machine": machine_summary(),
        "setting": (
            "softmax policy over each task's logged solutions, one logit per solution template shared across tasks; "
            "(a) gradient error vs the population real-execution GRPO gradient, (b) held-out expected true score after training"
        ),
        "train_tasks": {t: len(rs) for t, rs in train.records.items()},
        "eval_tasks": {t: len(rs) for t, rs in evaluate.records.items()},
        "vocabulary": len(train.vocabulary),
        "uniform_policy_score": {"heldout": uniform.expected_score(evaluate), "train": uniform.expected_score(train)},
        "best_possible_score": {
            "heldout": float(np.mean([evaluate.true[t].max() for t in evaluate.tasks])),
            "train": float(np.mean([train.true[t].max() for t in train.tasks])),
        },
        "total_wall_s": time.perf_counter() - started,
        "warnings": [idle] if idle is not None else [],
        "summary": summary,
        "per_seed": rows,
        "curves": curves,
    }
    result["plots"] = [
        str(_plot_gradient(config, summary, run_dir / "ablation_gradient.png")),
        str(_plot_training(config, curves, result, run_dir / "ablation_training.png")),
    ]
    return write_results(run_dir, result, tables(result))


def _replace(config: AblationConfig, **changes: Any) -> AblationConfig:
    import dataclasses

    return dataclasses.replace(config, **changes)


def _as_tensor(array: np.ndarray) -> Any:
    import torch

    return torch.as_tensor(array, dtype=torch.float64)


# ------------------------------------------------------------------ report
def _pm(row: Mapping[str, Any], key: str, digits: int = 3) -> str | None:
    mean, sd = row.get(key), row.get(f"{key}_sd")
    if mean is None:
        return None
    return f"{mean:.{digits}f}" if not sd else f"{mean:.{digits}f} ± {sd:.{digits}f}"


_NORM_TITLE = {"std": "GRPO (std-scaled advantages)", "centred": "Dr.GRPO (centred advantages, no std)"}


def tables(result: Mapping[str, Any]) -> str:
    """One Markdown table per normalisation, then the setting."""
    cfg = result["config"]
    parts = []
    for norm in cfg["normalisations"]:
        rows = [
            {
                "world model": r["world_model"], "variant": r["variant"], "seeds": r["seeds"],
                "grad error (best step)": _pm(r, "grad_err"), "grad direction bias": _pm(r, "grad_dir_bias", 4),
                "grad rel. bias² (trainer scale)": _pm(r, "grad_bias2", 4),
                f"train-task score @{cfg['steps']}": _pm(r, "train_score"), f"held-out score @{cfg['steps']}": _pm(r, "heldout_score"),
                "final weight": _pm(r, "final_weight", 2), "map fitted at step": _pm(r, "fitted_at_step", 0),
                "informative anchor groups": _pm(r, "informative_anchor_share", 2),
            }
            for r in result["summary"] if r["normalisation"] == norm
        ]  # fmt: skip
        parts.append(f"**{_NORM_TITLE[norm]}**\n\n" + markdown_table(rows))
    uni, best = result["uniform_policy_score"], result["best_possible_score"]
    note = (
        f"Setting: {result['setting']}. Policy trained on {len(result['train_tasks'])} {cfg['train_split']}-split tasks, "
        f"scored on {len(result['eval_tasks'])} {cfg['eval_split']}-split tasks ({cfg['tier']} tier); {result['vocabulary']} shared logits. "
        f"{cfg['steps']} steps x {cfg['groups_per_step']} groups x {cfg['group_size']} members, Adam lr {cfg['learning_rate']}, "
        f"anchor fraction {cfg['anchor_fraction']} (floor {cfg['anchor_min_per_step']}/step, "
        f"{cfg.get('anchor_selection', 'random')} selection), calibration start "
        f"{cfg['calibration_start_pairs']} pairs ({cfg.get('calibration_start_rule', 'count')} rule), refit every {cfg['calibration_refit_every']}, weight scale frozen after "
        f"{cfg['calibration_freeze_after']} groups ({cfg['weighter_start']}); noisy oracle: {cfg['oracle_bias']} bias, sigma "
        f"{cfg['oracle_sigma']}. Gradient error: policies after {list(cfg['gradient_states'])} real-execution steps, "
        f"{cfg['gradient_warmup']} warm-up + {cfg['gradient_batches']} measured batches each, reference from "
        f"{cfg['reference_batches']} real batches; lower = closer to the population real-execution gradient "
        f"(`real` row: the sampling noise of real execution itself). Expected true score of the uniform policy: "
        f"{uni['heldout']:.3f} held-out, {uni['train']:.3f} train tasks; best solution per task: {best['heldout']:.3f} / {best['train']:.3f}."
    )
    warned = "".join(f"\n\n**Warning:** {w}." for w in result.get("warnings") or [])
    return "\n\n".join(parts) + "\n\n" + note + warned


_STYLE = {
    "none": ("tab:gray", "-", "o"),
    "denoise": ("tab:blue", "--", "s"),
    "debias": ("tab:orange", "-.", "^"),
    "both": ("tab:green", "-", "D"),
    "wm-only": ("tab:red", ":", "v"),
    "real": ("black", "-", None),
}


def _figure(nrows: int, ncols: int, width: float, height: float) -> tuple[Any, np.ndarray]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), dpi=110, squeeze=False)
    return fig, axes


def _plot_gradient(config: AblationConfig, summary: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Batch-gradient error (best step size) per variant: one panel per (normalisation, world model)."""
    nrows, ncols = len(config.normalisations), len(config.world_models)
    fig, axes = _figure(nrows, ncols, 4.6 * ncols, 2.9 * nrows)
    for i, norm in enumerate(config.normalisations):
        for j, wm_name in enumerate(config.world_models):
            ax = axes[i, j]
            mine = {r["variant"]: r for r in summary if r["world_model"] == wm_name and r["normalisation"] == norm}
            ys = np.arange(len(VARIANTS))[::-1]
            vals = [mine[v]["grad_err"] for v in VARIANTS]
            errs = [mine[v]["grad_err_sd"] or 0.0 for v in VARIANTS]
            ax.barh(ys, vals, xerr=errs, color=[_STYLE[v][0] for v in VARIANTS], capsize=3)
            ax.set_yticks(ys, VARIANTS)
            lo, hi = min(v - e for v, e in zip(vals, errs)), max(v + e for v, e in zip(vals, errs))
            ax.set_xlim(max(0.0, lo - 0.15 * (hi - lo)), hi + 0.1 * (hi - lo))  # zoomed: differences are small
            ax.set_title(f"{wm_name}, {norm}", fontsize=9)
            ax.set_xlabel("batch-gradient error at best step size (vs population real)", fontsize=8)
    return save_figure(fig, path)


def _plot_training(config: AblationConfig, curves: Mapping[str, list], result: Mapping[str, Any], path: Path) -> Path:
    """Expected true score on the training tasks vs step (mean over seeds), one panel per (normalisation, world model)."""
    nrows, ncols = len(config.normalisations), len(config.world_models)
    fig, axes = _figure(nrows, ncols, 4.6 * ncols + 1.4, 2.9 * nrows)
    for i, norm in enumerate(config.normalisations):
        for j, wm_name in enumerate(config.world_models):
            ax = axes[i, j]
            for v in VARIANTS:
                runs = curves.get(f"{wm_name}/{norm}/{v}", [])
                if not runs:
                    continue
                steps = [s for s, _, _ in runs[0]]
                mean = np.mean([[t for _, _, t in c] for c in runs], axis=0)
                color, ls, marker = _STYLE[v]
                ax.plot(
                    steps,
                    mean,
                    color=color,
                    ls=ls,
                    marker=marker,
                    markevery=max(1, len(steps) // 6),
                    ms=4,
                    lw=1.4,
                    label=v,
                )
            ax.set_title(f"{wm_name}, {norm}", fontsize=9)
            ax.set_xlabel("GRPO step", fontsize=8)
            ax.set_ylabel("expected true score, train tasks", fontsize=8)
    axes[0, -1].legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)
    return save_figure(fig, path)
