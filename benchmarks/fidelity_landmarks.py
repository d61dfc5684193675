"""Landmark meta-features: does knowing how cheap learners fare on a task's *public* training
table help the world model rank solutions on tables it has never seen?

::

    nice -n 19 python -m benchmarks.fidelity_landmarks --out docs/results [--folds 5]
        [--table wmrl_envs/world_models/landmark_table.json] [--refresh]

Landmarking describes a table by the cross-validated scores of a few cheap learners. A world
model may compute them: they use only the training table an agent is given (never the held-out
answers), once per task, not per solution.
:func:`~wmrl_envs.world_models.landmarks.landmarks` cross-validates a few cheap learners
(3 folds, at most 2,000 training rows) and gives each one's gap to the best in R^2 or accuracy
("gap landmarks") and where it lands between a constant predictor and the best on the task's
own metric ("metric landmarks"). They are added to every record's ``context["meta"]``
(``landmark_*``), where the featurizer picks numeric context keys up, and the featurizer maps a
script's own estimators onto the metric landmarks
(:func:`~wmrl_envs.world_models.features.landmark_features`). Leave-datasets-out CV of the
world model is compared on the same records and folds (:mod:`benchmarks.fidelity_transfer`'s
data: the catalog's pool logs + the grown corpus), one block added per row: none, gap
landmarks, metric landmarks, own-estimator features. The split-noise ceiling
(:mod:`benchmarks.split_noise`) says how far ranking could go.

Landmarks of every logged task are kept in ``--table`` (the shipped table by default; tasks it
lacks -- every task with ``--refresh`` -- are computed, corpus tables rebuilt from their
sources, and added). Writes ``fidelity_landmarks.json`` into ``--out``. Functions: :func:`main`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from benchmarks.fidelity_transfer import VARIANTS, _by_tier, _fit, load_all
from wmrl_envs.world_models.landmarks import LANDMARK_KEYS, LANDMARK_TABLE, task_landmarks, with_landmarks
from wmrl_envs.world_models.transfer import leave_tasks_out

__all__ = ["main"]


def _task_tables(task_ids: set[str], root: Path) -> dict[str, Any]:
    """Task id -> a task object (catalog: shipped; corpus: rebuilt from its source under ``root``)."""
    from wmrl_envs.autoresearch.tasks import get_task
    from wmrl_envs.world_models.corpus import build_source_task, corpus_sources

    # The corpus was grown from both source lists (``--only-large`` added large variants).
    sources = {s.task_id: s for s in corpus_sources() + corpus_sources(only_large=True) if s.task_id in task_ids}
    return {
        tid: build_source_task(sources[tid], root)[0] if tid in sources else get_task(tid) for tid in sorted(task_ids)
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fidelity_landmarks", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="docs/results")
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--variant", default="base", choices=sorted(VARIANTS), help="world-model configuration")
    p.add_argument(
        "--table",
        default=str(LANDMARK_TABLE),
        help="landmarks per task: read, and written back with any logged task it lacks (default: the shipped table)",
    )
    p.add_argument("--refresh", action="store_true", help="recompute the landmarks of every logged task")
    args = p.parse_args(argv)
    started = time.time()
    cat, corp = load_all()
    records = cat + corp
    cache = Path(args.table)
    table: dict[str, dict[str, float]] = json.loads(cache.read_text()) if cache.is_file() else {}
    missing = {r.task_id for r in records} - (set() if args.refresh else set(table))
    with tempfile.TemporaryDirectory(prefix="wmrl-landmarks-") as root:
        tasks = _task_tables(missing, Path(root))
        for tid, task in tqdm(tasks.items(), desc="landmarks", unit="task"):
            if task is None:
                continue
            lm = task_landmarks(task)  # the same path as live grading contexts
            if not lm:
                table.pop(tid, None)  # unknown now: no stale entry
                continue
            table[tid] = lm
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    landmark_seconds = time.time() - started
    gaps_only = {t: {k: v for k, v in lm.items() if k in LANDMARK_KEYS} for t, lm in table.items()}
    full = with_landmarks(records, table)
    variants = (  # (row, records, own-estimator features)
        ("without landmarks", records, False),
        ("gap landmarks", with_landmarks(records, gaps_only), False),
        ("+ metric landmarks", full, False),
        ("+ own-estimator features", full, True),
    )
    rows = {}
    for name, recs, own in variants:
        fit = _fit({**VARIANTS[args.variant], "landmark_features": own})
        preds = leave_tasks_out(recs, fit, n_folds=args.folds)
        rows[name] = {
            t: {k: v for k, v in m.items() if k != "per_task_spearman"} for t, m in _by_tier(preds, recs).items()
        }
        print(name, {t: round(m["spearman_within_task"], 3) for t, m in rows[name].items()}, flush=True)
    result = {
        "command": "python -m benchmarks.fidelity_landmarks " + " ".join(sys.argv[1:] if argv is None else argv),
        "variant": args.variant,
        "folds": args.folds,
        "tasks_with_landmarks": len(table),
        "landmark_seconds": landmark_seconds,
        "rows": rows,
        "total_seconds": time.time() - started,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fidelity_landmarks.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
