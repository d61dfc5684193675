"""World-model exploitation monitor: does the policy learn to fool the world model?

A policy trained on world-model rewards can drift towards samples the world model overrates
(world-model RL papers warn about exactly this). Anchor groups expose it for free: their
members are graded by the world model *and* for real, on the current policy's own samples.
Per step, over the anchor groups that completed:

* ``gap``: mean of (calibrated world-model score - real score) over their members; a gap
  that grows positive during training means the policy is finding what the world model
  overrates;
* ``rank_agreement``: mean within-group Spearman correlation between calibrated and real
  scores (groups with constant scores on either side skipped): GRPO only uses the ranking
  inside a group, so this is what the world-model rewards get right or wrong.

* ``informative_groups``: anchor groups with a spread in both calibrated and real scores
  (>= 2 known members, not all equal on either side): the only ones that can teach the
  calibration a within-group ranking or move the denoising weight; the others by why:
  ``flat_true_groups`` / ``flat_calibrated_groups`` (>= 2 known members, all equal on that
  side; a group can be both) and ``single_pair_groups`` (one known member only);

* ``unknown_true`` / ``grader_failure_rate``: anchor members the world model graded whose
  real outcome is unknown (``None``: the grader failed), as a count and as a share of the
  anchor members the world model graded. Unknown is excluded from ``gap`` (never scored 0),
  so a policy could hide what it exploits behind grader failures -- a failure rate that
  grows is the sign, and the guard acts on it too.

The inputs are the ``group_result`` dicts the :class:`~wrappers.AnchorWrapper` reports
(``anchor``, ``calibrated``, ``true``: per-member lists). Acting on the numbers (raising the
anchor fraction, or stopping) is the trainer's business: see
:class:`agents.grpo.ExploitationGuard`.

Functions: :func:`anchor_group_stats`.

>>> stats = anchor_group_stats([{"anchor": True, "calibrated": [0.9, 0.6, 0.5], "true": [0.7, 0.6, 0.2]}])
>>> round(stats["gap"], 4), stats["rank_agreement"], stats["anchor_groups"], stats["informative_groups"]
(0.1667, 1.0, 1, 1)
>>> stats = anchor_group_stats([{"anchor": True, "calibrated": [0.56, 0.58], "true": [0.1, 0.1]}])
>>> stats["informative_groups"], stats["flat_true_groups"], stats["flat_calibrated_groups"]
(0, 1, 0)
>>> stats = anchor_group_stats([{"anchor": True, "calibrated": [0.9, 0.6], "true": [None, 0.6]}])
>>> stats["gap"], stats["unknown_true"], stats["grader_failure_rate"]
(0.0, 1, 0.5)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from scipy.stats import spearmanr

__all__ = ["anchor_group_stats"]


def anchor_group_stats(results: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``gap``, ``rank_agreement``, ``anchor_groups``, ``informative_groups`` (and the
    uninformative ones by why: ``flat_true_groups``, ``flat_calibrated_groups``,
    ``single_pair_groups``), ``unknown_true`` and ``grader_failure_rate`` over the anchor
    groups among ``results`` (unknown scores excluded from the first two; a statistic with
    nothing to average is ``None``)."""
    gaps: list[float] = []
    ranks: list[float] = []
    n = informative = unknown = graded = flat_true = flat_calibrated = single = 0
    for r in results:
        if not r.get("anchor"):
            continue
        members = list(zip(r.get("calibrated") or (), r.get("true") or ()))
        graded += sum(c is not None for c, _ in members)
        unknown += sum(c is not None and t is None for c, t in members)
        pairs = [(c, t) for c, t in members if c is not None and t is not None]
        if not pairs:
            continue
        n += 1
        cal, true = np.array(pairs, dtype=float).T
        gaps.extend(cal - true)
        if len(pairs) < 2:
            single += 1
            continue
        cal_flat, true_flat = bool(np.ptp(cal) <= 1e-9), bool(np.ptp(true) <= 1e-9)
        flat_calibrated += cal_flat
        flat_true += true_flat
        if not (cal_flat or true_flat):
            informative += 1
            ranks.append(float(spearmanr(cal, true).statistic))
    return {
        "gap": float(np.mean(gaps)) if gaps else None,
        "rank_agreement": float(np.mean(ranks)) if ranks else None,
        "anchor_groups": n,
        "informative_groups": informative,
        "flat_true_groups": flat_true,
        "flat_calibrated_groups": flat_calibrated,
        "single_pair_groups": single,
        "unknown_true": unknown,
        "grader_failure_rate": unknown / graded if graded else None,
    }
