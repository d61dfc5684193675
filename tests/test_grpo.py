"""Edge cases of the GRPO core (agents.grpo)."""

import math

import pytest
import torch

from agents.grpo import concat_segments, group_advantages, grpo_loss


def test_advantages_standardised_within_each_group():
    r = group_advantages([0.0, 1.0, 0.2, 0.6], [0, 0, 1, 1], eps=0.0)
    assert r.advantages == pytest.approx([-1.0, 1.0, -1.0, 1.0])
    r = group_advantages([0.0, 0.5, 1.0], ["g"] * 3, eps=0.0)
    std = math.sqrt(((0.5) ** 2 * 2) / 3)
    assert r.advantages == pytest.approx([-0.5 / std, 0.0, 0.5 / std])


def test_none_rewards_are_excluded_not_zero():
    # If None were scored 0, the 0.4 member would get a positive advantage.
    r = group_advantages([0.4, None, 0.8], [1, 1, 1], scale_by_std=False)
    assert r.advantages == pytest.approx([-0.2, None, 0.2]) and r.advantages[1] is None
    assert r.stats.graded == 2 and r.stats.ungraded == 1


def test_groups_with_fewer_than_two_graded_members_are_skipped():
    r = group_advantages([0.3, None, None, None, 0.9], ["a", "a", "b", "b", "c"])
    assert r.advantages == [None] * 5
    assert (r.stats.groups, r.stats.groups_used, r.stats.groups_skipped) == (3, 0, 3)
    assert r.mask() == [False] * 5


def test_degenerate_groups_counted_with_zero_advantage():
    r = group_advantages([0.5, 0.5, None, 0.1, 0.9], ["a", "a", "a", "b", "b"])
    assert r.advantages[:3] == [0.0, 0.0, None]
    assert r.stats.groups_degenerate == 1 and r.stats.groups_used == 2
    assert r.advantages[3] < 0 < r.advantages[4]


def test_anchor_groups_scaled_by_anchor_weight_only():
    rewards = [0.1, 0.9, 0.1, 0.9]
    groups = ["anchor", "anchor", "wm", "wm"]
    sources = ["env", "env", "wm", "wm"]
    base = group_advantages(rewards, groups, sources=sources, anchor_weight=1.0)
    weighted = group_advantages(rewards, groups, sources=sources, anchor_weight=2.5)
    assert weighted.advantages[:2] == pytest.approx([2.5 * a for a in base.advantages[:2]])
    assert weighted.advantages[2:] == pytest.approx(base.advantages[2:])
    assert weighted.stats.anchor_groups == 1


def test_anchor_group_with_ungraded_member_source_none():
    r = group_advantages(
        [0.2, 0.6, None], [0, 0, 0], sources=["env", "env", None], anchor_weight=3.0, scale_by_std=False
    )
    assert r.advantages == pytest.approx([-0.6, 0.6, None])


def test_dr_grpo_centres_without_std():
    r = group_advantages([0.0, 0.1], [0, 0], scale_by_std=False)
    assert r.advantages == pytest.approx([-0.05, 0.05])
    std = group_advantages([0.0, 0.1], [0, 0], eps=0.0)
    assert std.advantages == pytest.approx([-1.0, 1.0])


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="group_ids has 1"):
        group_advantages([0.1, 0.2], [0])
    with pytest.raises(ValueError, match=r"rewards\[1\]"):
        group_advantages([0.1, float("nan")], [0, 0])
    with pytest.raises(ValueError, match="mixes sources"):
        group_advantages([0.1, 0.2], [0, 0], sources=["env", "wm"])
    with pytest.raises(ValueError, match="anchor_weight"):
        group_advantages([0.1, 0.2], [0, 0], anchor_weight=0.0)
    with pytest.raises(ValueError, match=r"sources\[0\]"):
        group_advantages([0.1, 0.2], [0, 0], sources=["real", "real"])


def _lp(values):
    return torch.tensor(values, dtype=torch.float64)


def test_loss_on_policy_equals_negative_mean_advantage_and_gradient_direction():
    logits = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    logprobs = torch.nn.functional.logsigmoid(logits)
    mask = _lp([[1, 1, 0], [1, 1, 1]])
    adv = _lp([1.0, -1.0])
    out = grpo_loss(logprobs, logprobs.detach(), adv, mask)
    # token-mean: (2 * -1 + 3 * +1) / 5
    assert float(out.loss.detach()) == pytest.approx(1.0 / 5)
    out.loss.backward()
    # Positive advantage: descending the loss raises the token's logprob; masked token gets no gradient.
    assert logits.grad[0, 0] < 0 and logits.grad[1, 0] > 0 and logits.grad[0, 2] == 0
    assert out.metrics["tokens"] == 5 and out.metrics["clip_frac"] == 0


def test_seq_mean_token_mean_aggregation_and_empty_rows():
    lp = _lp([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
    mask = _lp([[1, 0, 0], [1, 1, 1], [0, 0, 0]])
    adv = _lp([1.0, 1.0, 5.0])
    out = grpo_loss(lp, lp, adv, mask, aggregation="seq-mean-token-mean")
    assert float(out.loss.detach()) == pytest.approx(-1.0)  # the all-masked row does not count


def test_clipping_stops_gradient_beyond_trust_region():
    lp = torch.tensor([[0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    old = _lp([[-1.0, 0.0]])  # ratio e ~ 2.72 on token 0, 1.0 on token 1
    out = grpo_loss(lp, old, _lp([1.0]), _lp([[1, 1]]), epsilon=0.2)
    out.loss.backward()
    assert lp.grad[0, 0] == 0 and lp.grad[0, 1] != 0
    assert out.metrics["clip_frac"] == pytest.approx(0.5)
    # A negative advantage with ratio > 1 + eps is not clipped (pessimistic bound).
    lp.grad = None
    grpo_loss(lp, old, _lp([-1.0]), _lp([[1, 1]]), epsilon=0.2).loss.backward()
    assert lp.grad[0, 0] != 0


def test_clip_frac_counts_only_the_clips_the_min_applies():
    """Ratios outside the range on the side the min ignores (ratio > 1 + eps with A < 0, ratio
    < 1 - eps with A > 0) are not clipped: they keep their gradient and do not count."""
    lp = torch.tensor([[0.0, 0.0, 0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    old = _lp([[-1.0, 1.0, 0.0, -0.1]])  # ratios e ~ 2.72, 1/e ~ 0.37, 1.0, 1.105 (inside)
    mask = _lp([[1, 1, 1, 1]])
    pos = grpo_loss(lp, old, _lp([1.0]), mask, epsilon=0.2)
    pos.loss.backward()
    assert [g != 0 for g in lp.grad[0].tolist()] == [False, True, True, True]
    assert pos.metrics["clip_frac"] == pytest.approx(0.25)  # only token 0 (the old code counted 2 of 4)
    lp.grad = None
    neg = grpo_loss(lp, old, _lp([-1.0]), mask, epsilon=0.2)
    neg.loss.backward()
    assert [g != 0 for g in lp.grad[0].tolist()] == [True, False, True, True]
    assert neg.metrics["clip_frac"] == pytest.approx(0.25)  # only token 1


def test_clip_higher_widens_upper_bound():
    lp = torch.tensor([[0.0]], dtype=torch.float64, requires_grad=True)
    old = _lp([[-0.25]])  # ratio 1.28
    grpo_loss(lp, old, _lp([1.0]), _lp([[1]]), epsilon=0.2, epsilon_high=0.3).loss.backward()
    assert lp.grad[0, 0] != 0


def test_kl_term_zero_at_reference_and_positive_away_from_it():
    lp = _lp([[-1.0, -2.0]])
    mask = _lp([[1, 1]])
    zero_adv = _lp([0.0])
    at_ref = grpo_loss(lp, lp, zero_adv, mask, ref_logprobs=lp, beta=0.1)
    assert at_ref.metrics["kl"] == pytest.approx(0.0) and float(at_ref.loss.detach()) == pytest.approx(0.0)
    away = grpo_loss(lp, lp, zero_adv, mask, ref_logprobs=_lp([[-0.5, -2.5]]), beta=0.1)
    k3 = lambda d: math.exp(d) - d - 1  # noqa: E731
    expected = (k3(0.5) + k3(-0.5)) / 2
    assert away.metrics["kl"] == pytest.approx(expected)
    assert float(away.loss.detach()) == pytest.approx(0.1 * expected)


def test_entropy_bonus_lowers_loss():
    lp = _lp([[-1.0]])
    ent = _lp([[2.0]])
    out = grpo_loss(lp, lp, _lp([0.0]), _lp([[1]]), entropy=ent, entropy_coef=0.01)
    assert float(out.loss.detach()) == pytest.approx(-0.02) and out.metrics["entropy"] == pytest.approx(2.0)


def test_observation_tokens_masked_out_of_multi_turn_loss():
    ids, mask = concat_segments([([11, 12], False), ([21, 22], True), ([31], False), ([41], True)])
    assert ids == [11, 12, 21, 22, 31, 41] and mask == [0, 0, 1, 1, 0, 1]
    logits = torch.zeros(1, len(ids), dtype=torch.float64, requires_grad=True)
    lp = torch.nn.functional.logsigmoid(logits)
    grpo_loss(lp, lp.detach(), _lp([1.0]), torch.tensor([mask], dtype=torch.float64)).loss.backward()
    assert [bool(g != 0) for g in logits.grad[0]] == [bool(m) for m in mask]


def test_loss_rejects_mismatched_shapes_and_missing_terms():
    lp = _lp([[0.0, 0.0]])
    with pytest.raises(ValueError, match="mask has shape"):
        grpo_loss(lp, lp, _lp([1.0]), _lp([[1.0]]))
    with pytest.raises(ValueError, match="advantages must have shape"):
        grpo_loss(lp, lp, _lp([1.0, 2.0]), _lp([[1, 1]]))
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        grpo_loss(lp, lp, _lp([1.0]), _lp([[1, 1]]), beta=0.1)
    with pytest.raises(ValueError, match="aggregation"):
        grpo_loss(lp, lp, _lp([1.0]), _lp([[1, 1]]), aggregation="sum")
