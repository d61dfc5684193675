"""Is the small tier's template-pool CV loss systematic? Per-table within-task Spearman of two
recipes in the leave-datasets-out CV (5 folds), per fold seed.

    python docs/results/agent-fidelity/pertask-cv/pertask_cv.py run templates 0             # previous recipe
    python docs/results/agent-fidelity/pertask-cv/pertask_cv.py run templates+agent+reading 0
    python docs/results/agent-fidelity/pertask-cv/pertask_cv.py compare docs/results/agent-fidelity/pertask-cv

``run`` writes ``ARM-seedS.json`` (per tier: overall and per-table Spearman) beside this file;
``compare`` prints, per tier, the mean paired difference per fold seed, how well the per-table
differences of one fold seed predict another's (Spearman), and the tables lower / higher on
every fold seed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

HERE = Path(__file__).resolve().parent
BASE, NEW = "templates", "templates+agent+reading"


def run(arm: str, seed: int) -> None:
    from benchmarks.agent_fidelity import template_pool_cv

    by_tier = template_pool_cv(arm, folds=5, seed=seed, per_task=True)
    out = {
        t: {"spearman_within_task": m["spearman_within_task"], "per_task": m["per_task_spearman"]}
        for t, m in by_tier.items()
    }
    (HERE / f"{arm}-seed{seed}.json").write_text(json.dumps(out, indent=1, sort_keys=True))


def compare(directory: Path) -> dict:
    seeds = sorted(int(p.stem.rsplit("seed", 1)[1]) for p in directory.glob(f"{NEW}-seed*.json"))
    report = {}
    for tier in ("small", "full", "corpus"):
        diffs = []
        for s in seeds:
            new = json.loads((directory / f"{NEW}-seed{s}.json").read_text())[tier]["per_task"]
            base = json.loads((directory / f"{BASE}-seed{s}.json").read_text())[tier]["per_task"]
            diffs.append({k: new[k] - base[k] for k in new if new[k] is not None and base.get(k) is not None})
        tables = sorted(set.intersection(*(set(d) for d in diffs)))
        m = np.array([[d[k] for k in tables] for d in diffs])
        pairs = [(i, j) for i in range(len(seeds)) for j in range(i + 1, len(seeds))]
        report[tier] = {
            "fold_seeds": seeds,
            "tables": len(tables),
            "mean_paired_difference_per_seed": m.mean(axis=1).round(4).tolist(),
            "per_table_difference_agreement_between_seeds": {
                f"{seeds[i]}-{seeds[j]}": round(float(spearmanr(m[i], m[j])[0]), 3) for i, j in pairs
            },
            "tables_lower_on_every_seed": [tables[k] for k in np.flatnonzero((m < 0).all(axis=0))],
            "tables_higher_on_every_seed": [tables[k] for k in np.flatnonzero((m > 0).all(axis=0))],
        }
    return report


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(sys.argv[2], int(sys.argv[3]))
    else:
        print(json.dumps(compare(Path(sys.argv[2])), indent=1))
