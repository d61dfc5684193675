"""How far can ranking by transfer go? The world model against the template prior and an oracle.

::

    nice -n 19 python -m benchmarks.fidelity_ceiling --out docs/results [--landmarks 2,4,6,10] [--folds 5]

Same data and leave-datasets-out folds as :mod:`benchmarks.fidelity_transfer` (catalog pool
logs + the grown corpus). Every predictor below is scored by task (within-task Spearman,
pairwise accuracy; all solutions and truly valid ones) on the **same** records -- the pool
templates that are not landmarks in the largest landmark set:

* ``model (base, CV)`` -- the shipped default's configuration, out of fold
  (:func:`~wmrl_envs.world_models.transfer.leave_tasks_out`);
* ``template prior`` -- a template's mean score on the other folds' tables of the same task
  type (:func:`~wmrl_envs.world_models.transfer.template_transfer` without landmarks): what
  knowing the solution, and nothing about the new table, gives;
* ``oracle k landmarks`` -- the same transfer, told the *true* scores of ``k`` cheap
  templates executed on the new table (information no world model has before execution).

If even the oracle stays below a target, the target is out of reach of transfer at this
number of training tasks, whatever the model. Writes ``fidelity_ceiling.json`` and
``fidelity_ceiling.png`` into ``--out``.

Functions: :func:`main`. Constants: :data:`LANDMARKS`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import new_figure, save_figure
from benchmarks.fidelity_transfer import VARIANTS, _fit, load_all
from wmrl_envs.outcome import Outcome
from wmrl_envs.world_models.logs import LogRecord
from wmrl_envs.world_models.transfer import leave_tasks_out, ranking_metrics, template_transfer, tier_of

__all__ = ["LANDMARKS", "main"]

#: Landmark templates in the order they are added (cheap ones first; all run on every tier).
LANDMARKS: tuple[str, ...] = (
    "tree_depth_2", "knn_15", "weak_two_columns_tree", "hgb_shallow", "rf_10_depth4",
    "mlp_64", "tree_depth_8", "knn_1", "extra_trees_100", "hgb_default",
)  # fmt: skip
_KEYS = ("n_tasks", "n_records", "spearman_within_task", "spearman_within_task_valid", "pairwise_accuracy", "pairwise_accuracy_valid")  # fmt: skip


def _as_outcomes(scores: Sequence[float | None]) -> list[Outcome | None]:
    return [None if s is None else Outcome("valid", float(s)) for s in scores]


def _tiers(preds: Sequence[Outcome | None], records: Sequence[LogRecord], keep: Sequence[bool]) -> dict[str, Any]:
    out = {}
    for tier in ("small", "full", "corpus"):
        idx = [i for i, r in enumerate(records) if keep[i] and tier_of(r) == tier]
        m = ranking_metrics([preds[i] for i in idx], [records[i] for i in idx])
        out[tier] = {k: m.get(k) for k in _KEYS}
    return out


def _plot(rows: Mapping[str, Mapping[str, Any]], path: Path) -> Path:
    import numpy as np

    names = list(rows)
    tiers = ("small", "full", "corpus")
    fig, ax = new_figure(10, 4)
    width = 0.8 / len(names)
    for j, name in enumerate(names):
        vals = [rows[name][t]["spearman_within_task"] or 0.0 for t in tiers]
        ax.bar(np.arange(len(tiers)) + j * width, vals, width, label=name)
    ax.axhline(0.85, color="red", ls="--", lw=1, label="target 0.85")
    ax.set_xticks(np.arange(len(tiers)) + 0.4 - width / 2, [f"{t} tier" for t in tiers])
    ax.set_ylim(0.5, 1.0)
    ax.set_ylabel("within-task Spearman (leave-datasets-out)")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3, axis="y")
    fig.suptitle("Ranking unseen tables: world model vs template prior vs oracle landmarks")
    return save_figure(fig, path)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fidelity_ceiling", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="docs/results")
    p.add_argument("--landmarks", default="2,4,6,10", help="comma list of landmark counts (prefixes of LANDMARKS)")
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--alpha", type=float, default=1.0, help="ridge penalty of the oracle transfer")
    p.add_argument("--variant", default="base", choices=sorted(VARIANTS), help="world-model configuration")
    args = p.parse_args(argv)
    counts = sorted(int(k) for k in args.landmarks.split(","))
    if not counts or counts[-1] > len(LANDMARKS) or counts[0] < 1:
        p.error(f"--landmarks: counts between 1 and {len(LANDMARKS)}, got {args.landmarks!r}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    cat, corp = load_all()
    records = cat + corp
    excluded = set(LANDMARKS[: counts[-1]])
    keep = [bool(r.solution_id) and r.solution_id not in excluded for r in records]
    rows: dict[str, dict[str, Any]] = {}
    model_preds = leave_tasks_out(records, _fit(VARIANTS[args.variant]), n_folds=args.folds)
    rows[f"model ({args.variant}, CV)"] = _tiers(model_preds, records, keep)
    rows["template prior"] = _tiers(_as_outcomes(template_transfer(records, n_folds=args.folds)), records, keep)
    for k in counts:
        scores = template_transfer(records, LANDMARKS[:k], n_folds=args.folds, alpha=args.alpha)
        rows[f"oracle {k} landmarks"] = _tiers(_as_outcomes(scores), records, keep)
    for name, row in rows.items():
        print(f"{name:24s}", "  ".join(f"{t} {v['spearman_within_task']:.3f}" for t, v in row.items()), flush=True)
    result = {
        "command": "python -m benchmarks.fidelity_ceiling " + " ".join(sys.argv[1:] if argv is None else argv),
        "landmarks": list(LANDMARKS[: counts[-1]]),
        "alpha": args.alpha,
        "folds": args.folds,
        "rows": rows,
        "plot": str(_plot(rows, out / "fidelity_ceiling.png")),
        "total_seconds": time.time() - started,
    }
    (out / "fidelity_ceiling.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
