"""The GRPO core shared by every agent: group advantages and the clipped token-level loss.

Nothing here knows about language models, tokenizers or envs. An agent supplies, per
trajectory, a reward (``None`` = unknown), a group id and a source (``"env"`` for anchor
groups graded by real execution, ``"wm"`` for world-model groups), and per token the
log-probabilities under the current / behaviour / reference policies plus a loss mask.

* :func:`group_advantages` — normalise rewards within each GRPO group over its *graded*
  members only; unknown rewards are excluded (never scored 0); groups with fewer than two
  graded members are skipped; groups whose graded rewards are all equal are counted as
  degenerate (advantage 0); anchor groups are multiplied by the current anchor weight
  (WMRL's Inverse-Variance Denoising); ``scale_by_std=False`` gives Dr.GRPO's centring.
* :func:`grpo_loss` — PPO-style clipped policy gradient per token, optional k3 KL to a
  frozen reference, optional entropy bonus, over a mask that keeps only the agent's own
  tokens (observation tokens of multi-turn episodes are masked out).

Names and differences with TRL's ``GRPOTrainer`` where the concept is the same:

* ``beta`` is the KL coefficient, ``epsilon`` / ``epsilon_high`` the lower / upper clip range
  (``epsilon_high=None`` = ``epsilon``; DAPO's clip-higher uses e.g. 0.28), as in TRL.
* The group standard deviation is the *population* one (divide by n); TRL's
  ``scale_rewards="group"`` uses ``torch.std``, the *sample* one (divide by n - 1), so for a
  group of n its advantages are ``sqrt((n - 1) / n)`` times ours (0.87x for n = 4): a
  constant factor per group size, i.e. a learning-rate rescaling, not a different direction.
* "Dr.GRPO" here means only the advantage part of Dr.GRPO: ``scale_by_std=False`` centres
  without dividing by the std (TRL: ``scale_rewards="none"``). Dr.GRPO's other change, the
  loss normalised by a constant (TRL's ``loss_type="dr_grpo"``: batch x max completion
  length), is not implemented; ``"token-mean"`` divides by the batch's actual number of
  action tokens (TRL's ``"dapo"`` / ``"bnpo"``), ``"seq-mean-token-mean"`` is TRL's ``"grpo"``.
* :func:`concat_segments` — build one multi-turn sequence and its loss mask from
  ``(tokens, is_action)`` segments.

Classes: :class:`AdvantageResult`, :class:`LossOutput`.
Functions: :func:`group_advantages`, :func:`grpo_loss`, :func:`concat_segments`.

>>> r = group_advantages([1.0, 0.0, None, 0.5, 0.5], ["a", "a", "a", "b", "b"], scale_by_std=False)
>>> r.advantages
[0.5, -0.5, None, 0.0, 0.0]
>>> (r.stats.groups_used, r.stats.groups_degenerate, r.stats.ungraded)
(2, 1, 1)
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

__all__ = [
    "AdvantageStats",
    "AdvantageResult",
    "LossOutput",
    "group_advantages",
    "grpo_loss",
    "concat_segments",
    "LOSS_AGGREGATIONS",
    "LossAggregation",
]

#: ``"token-mean"``: every unmasked token of the batch weighs the same (DAPO / Dr.GRPO);
#: ``"seq-mean-token-mean"``: mean over each sequence's tokens, then over sequences
#: (the original GRPO paper, which favours short answers).
LossAggregation = Literal["token-mean", "seq-mean-token-mean"]
LOSS_AGGREGATIONS: tuple[LossAggregation, ...] = ("token-mean", "seq-mean-token-mean")


@dataclass(frozen=True)
class AdvantageStats:
    """Bookkeeping of one :func:`group_advantages` call (all counts; logged by trainers).

    Attributes:
        groups: distinct group ids seen.
        groups_used: groups that produced advantages (>= 2 graded members), degenerate included.
        groups_skipped: groups with fewer than 2 graded members (their members get ``None``).
        groups_degenerate: used groups whose graded rewards are all equal (advantage 0).
        anchor_groups: used groups whose source is ``"env"``.
        graded: members with a known reward.
        ungraded: members with reward ``None``.
    """

    groups: int
    groups_used: int
    groups_skipped: int
    groups_degenerate: int
    anchor_groups: int
    graded: int
    ungraded: int


@dataclass(frozen=True)
class AdvantageResult:
    """Per-member advantages (``None`` = excluded from the loss) and their statistics."""

    advantages: list[float | None]
    stats: AdvantageStats

    def mask(self) -> list[bool]:
        """True for the members that carry an advantage."""
        return [a is not None for a in self.advantages]


def group_advantages(  # noqa: C901 -- complexity over 15 before the limit (issue 26)
    rewards: Sequence[float | None],
    group_ids: Sequence[Hashable],
    *,
    sources: Sequence[str | None] | None = None,
    anchor_weight: float = 1.0,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> AdvantageResult:
    """GRPO advantages ``(r - mean_g) / (std_g + eps)`` over each group's graded members.

    Args:
        rewards: one trajectory reward per member, ``None`` when unknown.
        group_ids: the member's group (any hashable; the env's ``group_id``).
        sources: the member's ``info["source"]`` (``"env"`` = anchor group, ``"wm"``, or
            ``None`` when the member was never graded). All graded members of a group must
            share one source, since the anchor decision is made per group.
        anchor_weight: multiplier of anchor-group advantages (``info["anchor_weight"]``);
            ``1.0`` means plain GRPO.
        scale_by_std: divide by the group's (population) standard deviation; ``False`` is
            Dr.GRPO's unbiased centring.
        eps: added to the std so near-degenerate groups stay finite.

    Returns:
        :class:`AdvantageResult`; members of skipped groups and ungraded members get ``None``,
        members of degenerate groups get ``0.0``.

    Raises:
        ValueError: lengths differ, a reward is not a finite number / ``None``, a source is
            unknown, a group mixes sources, or ``anchor_weight`` is not a positive finite number.
    """
    n = len(rewards)
    if len(group_ids) != n:
        raise ValueError(f"group_ids has {len(group_ids)} entries but rewards has {n}")
    if sources is not None and len(sources) != n:
        raise ValueError(f"sources has {len(sources)} entries but rewards has {n}")
    if not (isinstance(anchor_weight, (int, float)) and math.isfinite(anchor_weight) and anchor_weight > 0):
        raise ValueError(f"anchor_weight must be a positive finite number, got {anchor_weight!r}")
    for i, r in enumerate(rewards):
        if r is not None and not (isinstance(r, (int, float)) and math.isfinite(r)):
            raise ValueError(f"rewards[{i}] must be a finite number or None, got {r!r}")
    if sources is not None:
        for i, s in enumerate(sources):
            if s not in ("env", "wm", None):
                raise ValueError(f"sources[{i}] must be 'env', 'wm' or None, got {s!r}")

    members: OrderedDict[Hashable, list[int]] = OrderedDict()
    for i, g in enumerate(group_ids):
        members.setdefault(g, []).append(i)

    advantages: list[float | None] = [None] * n
    used = skipped = degenerate = anchors = 0
    for g, idx in members.items():
        graded = [i for i in idx if rewards[i] is not None]
        if len(graded) < 2:
            skipped += 1
            continue
        used += 1
        group_sources: set[str] = (
            {src for i in graded if (src := sources[i]) is not None} if sources is not None else set()
        )
        if len(group_sources) > 1:
            raise ValueError(f"group {g!r} mixes sources {sorted(group_sources)}; anchor decisions are per group")
        is_anchor = group_sources == {"env"}
        anchors += is_anchor
        values = [float(rw) for i in graded if (rw := rewards[i]) is not None]  # all of graded
        mean = sum(values) / len(values)
        if max(values) - min(values) == 0.0:
            degenerate += 1
            for i in graded:
                advantages[i] = 0.0
            continue
        scale = 1.0
        if scale_by_std:
            std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
            scale = 1.0 / (std + eps)
        weight = anchor_weight if is_anchor else 1.0
        for i, v in zip(graded, values):
            advantages[i] = (v - mean) * scale * weight

    n_graded = sum(r is not None for r in rewards)
    stats = AdvantageStats(
        groups=len(members),
        groups_used=used,
        groups_skipped=skipped,
        groups_degenerate=degenerate,
        anchor_groups=anchors,
        graded=n_graded,
        ungraded=n - n_graded,
    )
    return AdvantageResult(advantages, stats)


@dataclass
class LossOutput:
    """The scalar loss to backpropagate and detached diagnostics (floats)."""

    loss: torch.Tensor
    metrics: dict[str, float]


def _aggregate(values: torch.Tensor, mask: torch.Tensor, how: str) -> torch.Tensor:
    if how == "token-mean":
        return (values * mask).sum() / mask.sum().clamp(min=1.0)
    # seq-mean-token-mean: sequences without any action token do not count.
    per_seq_tokens = mask.sum(dim=1)
    per_seq = (values * mask).sum(dim=1) / per_seq_tokens.clamp(min=1.0)
    has_tokens = (per_seq_tokens > 0).to(values.dtype)
    return (per_seq * has_tokens).sum() / has_tokens.sum().clamp(min=1.0)


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    ref_logprobs: torch.Tensor | None = None,
    beta: float = 0.0,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    aggregation: LossAggregation = "token-mean",
) -> LossOutput:
    """Clipped policy-gradient loss per token, plus optional KL and entropy terms.

    ``loss = agg(-min(ratio * A, clip(ratio, 1 - epsilon, 1 + epsilon_high) * A)
    + beta * KL_k3(pi || ref) - entropy_coef * H)`` over tokens where ``mask`` is 1.

    Args:
        logprobs: ``(B, T)`` log-probabilities of the taken tokens under the current policy
            (with grad).
        old_logprobs: ``(B, T)`` the same under the policy that sampled them (no grad).
        advantages: ``(B,)`` one advantage per sequence (rows without one should be
            dropped by the caller or given mask 0).
        mask: ``(B, T)`` 1 for the agent's own tokens, 0 for prompt / observation / padding.
        epsilon: lower clip range; ``epsilon_high`` the upper one (defaults to ``epsilon``;
            DAPO's clip-higher uses a larger value). Named as in TRL.
        ref_logprobs: ``(B, T)`` under a frozen reference; required when ``beta > 0``.
        beta: weight of the k3 KL estimator ``exp(ref - lp) - (ref - lp) - 1`` (>= 0,
            unbiased); TRL's name for the KL coefficient.
        entropy: ``(B, T)`` per-token entropy of the current policy; required when
            ``entropy_coef > 0``.
        entropy_coef: weight of the entropy bonus.
        aggregation: one of :data:`LOSS_AGGREGATIONS`.

    Returns:
        :class:`LossOutput` with metrics ``pg_loss``, ``kl``, ``entropy``, ``clip_frac``,
        ``ratio_mean``, ``tokens``. ``clip_frac`` is the share of action tokens whose loss the
        ``min`` actually took from the clipped term (ratio beyond ``1 + epsilon_high`` with a
        positive advantage, or below ``1 - epsilon`` with a negative one): those tokens carry
        no gradient. A ratio outside the range on the other side is not clipped by the ``min``.
    """
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be (B, T), got shape {tuple(logprobs.shape)}")
    for name, t in (
        ("old_logprobs", old_logprobs),
        ("mask", mask),
        ("ref_logprobs", ref_logprobs),
        ("entropy", entropy),
    ):
        if t is not None and t.shape != logprobs.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(logprobs.shape)} like logprobs")
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"advantages must have shape ({logprobs.shape[0]},), got {tuple(advantages.shape)}")
    if aggregation not in LOSS_AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {LOSS_AGGREGATIONS}, got {aggregation!r}")
    if beta < 0 or entropy_coef < 0 or epsilon <= 0 or (epsilon_high is not None and epsilon_high <= 0):
        raise ValueError(
            f"need beta >= 0, entropy_coef >= 0, epsilon > 0, epsilon_high > 0 or None; "
            f"got {beta}, {entropy_coef}, {epsilon}, {epsilon_high}"
        )
    if beta > 0 and ref_logprobs is None:
        raise ValueError("beta > 0 needs ref_logprobs")
    if entropy_coef > 0 and entropy is None:
        raise ValueError("entropy_coef > 0 needs entropy")

    mask = mask.to(logprobs.dtype)
    high = epsilon if epsilon_high is None else epsilon_high
    adv = advantages.to(logprobs.dtype).unsqueeze(1)
    # Masked positions may hold padding garbage: zero the log-ratio there so exp() stays finite.
    log_ratio = (logprobs - old_logprobs.detach()) * mask
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - epsilon, 1.0 + high) * adv
    pg = -torch.minimum(unclipped, clipped)
    pg_loss = _aggregate(pg, mask, aggregation)
    loss = pg_loss

    metrics: dict[str, Any] = {"pg_loss": float(pg_loss.detach())}
    if ref_logprobs is not None:
        delta = (ref_logprobs.detach() - logprobs) * mask
        kl = _aggregate(torch.exp(delta) - delta - 1.0, mask, aggregation)
        if beta > 0:
            loss = loss + beta * kl
        metrics["kl"] = float(kl.detach())
    if entropy is not None:
        ent = _aggregate(entropy, mask, aggregation)
        if entropy_coef > 0:
            loss = loss - entropy_coef * ent
        metrics["entropy"] = float(ent.detach())
    with torch.no_grad():
        tokens = mask.sum().clamp(min=1.0)
        # The min picks the clipped term exactly where it is smaller (ties carry the same value).
        was_clipped = (clipped < unclipped).to(mask.dtype) * mask
        metrics["clip_frac"] = float(was_clipped.sum() / tokens)
        metrics["ratio_mean"] = float((ratio * mask).sum() / tokens)
        metrics["tokens"] = float(mask.sum())
    return LossOutput(loss, metrics)


def concat_segments(segments: Sequence[tuple[Sequence[int], bool]]) -> tuple[list[int], list[int]]:
    """Concatenate ``(tokens, is_action)`` segments into one sequence and its loss mask.

    Multi-turn episodes alternate the env's observation tokens (mask 0: the agent did not
    choose them) and the agent's actions (mask 1).

    >>> concat_segments([([1, 2], False), ([3], True), ([4, 5], False), ([6, 7], True)])
    ([1, 2, 3, 4, 5, 6, 7], [0, 0, 1, 0, 0, 1, 1])
    """
    ids: list[int] = []
    mask: list[int] = []
    for tokens, is_action in segments:
        ids.extend(int(t) for t in tokens)
        mask.extend([int(bool(is_action))] * len(tokens))
    return ids, mask
