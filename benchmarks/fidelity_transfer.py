"""World-model fidelity on tables never seen in fitting: leave-datasets-out CV, the fixed
catalog split, a learning curve over the number of training tasks, and confidence.

::

    nice -n 19 python -m benchmarks.fidelity_transfer --out docs/results [--variants base,transfer]
        [--folds 5] [--curve-sizes 4,8,16,32,64] [--repeats 2] [--no-corpus] [--landmarks]

Data: the catalog's pool logs (27 small + 9 full-size tasks) and the grown corpus
(:mod:`wmrl_envs.world_models.corpus`). Every number is by task, never by row:

1. **Leave-datasets-out CV** (``--folds``, grouped by dataset): each task's records are
   predicted by a model that never saw that dataset; metrics per tier (``small`` /
   ``full`` catalog tasks, ``corpus`` tasks), from
   :func:`wmrl_envs.world_models.transfer.ranking_metrics`;
2. **Fixed catalog split** (what the shipped default is judged on): fit on the catalog
   ``train`` split (+ the corpus), score the ``test`` split per tier;
3. **Learning curve**: the fixed split's held-out tasks, models fitted on random subsets of
   ``n`` training tasks (catalog train split + corpus), ``--repeats`` draws per size;
   plotted to ``fidelity_transfer_curve.png``;
4. **Confidence** (ensemble variants in the CV): the Spearman of confidence vs absolute
   error, and :func:`~wmrl_envs.world_models.transfer.anchor_preference_simulation`
   (random vs low-confidence anchor groups as calibration pairs).

Variants (:data:`VARIANTS`) are :class:`~wmrl_envs.world_models.CodeOutcomeConfig`
settings. ``--landmarks``: every record carries its task's landmarks
(:mod:`wmrl_envs.world_models.landmarks`), as the shipped default is fitted. Writes
``fidelity_transfer.json`` and the plot (``fidelity_transfer_landmarks.json`` and
``fidelity_transfer_curve_landmarks.png`` with ``--landmarks``) into ``--out``.

Functions: :func:`main`, :func:`load_all`. Constants: :data:`VARIANTS`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import new_figure, save_figure
from wmrl_envs.world_models.code_outcome import CodeOutcomeConfig, CodeOutcomeModel
from wmrl_envs.world_models.landmarks import with_landmarks
from wmrl_envs.world_models.logs import LogRecord, read_logs
from wmrl_envs.world_models.transfer import (
    anchor_preference_simulation,
    leave_tasks_out,
    predict_records,
    ranking_metrics,
    tier_of,
)

__all__ = ["VARIANTS", "main", "load_all"]

#: Model variants compared (CodeOutcomeConfig keyword arguments).
VARIANTS: Mapping[str, Mapping[str, Any]] = {
    "base": {},
    "transfer": {"transfer_features": True},
    "transfer+ranker": {"transfer_features": True, "percentile_head": "ranker"},
    "transfer+both": {"transfer_features": True, "percentile_head": "both"},
    "transfer+ens5": {"transfer_features": True, "n_ensemble": 5},
}
_HEADLINE = (
    "n_tasks", "n_records", "spearman_within_task", "spearman_within_task_valid", "pairwise_accuracy",
    "pairwise_accuracy_valid", "status_accuracy", "n_memory_failures", "memory_failure_status_accuracy",
    "n_time_failures", "time_failure_status_accuracy", "status_ece", "score_ece", "mae", "confidence_vs_error_spearman",
)  # fmt: skip


def load_all(corpus: bool = True) -> tuple[list[LogRecord], list[LogRecord]]:
    """(catalog pool records, corpus records), known outcomes only."""
    from wmrl_envs.autoresearch.leaderboard import logs_root
    from wmrl_envs.world_models.corpus import read_corpus

    cat = [r for r in read_logs(sorted(logs_root().glob("*.jsonl"))) if r.known]
    return cat, ([r for r in read_corpus() if r.known] if corpus else [])


def _fit(config: Mapping[str, Any]) -> Any:
    def fit(records: Sequence[LogRecord]) -> CodeOutcomeModel:
        return CodeOutcomeModel(CodeOutcomeConfig(keep_training_data=False, **config)).fit(records)

    return fit


def _by_tier(preds: Sequence[Any], records: Sequence[LogRecord]) -> dict[str, dict[str, Any]]:
    out = {}
    for tier in ("small", "full", "corpus"):
        idx = [i for i, r in enumerate(records) if tier_of(r) == tier and preds[i] is not None]
        if idx:
            m = ranking_metrics([preds[i] for i in idx], [records[i] for i in idx])
            out[tier] = {k: m.get(k) for k in _HEADLINE} | {
                "status_accuracy_by_status": m.get("status_accuracy_by_status"),
                "per_task_spearman": m.get("per_task_spearman"),
            }
    return out


def _split(records: Sequence[LogRecord]) -> dict[str, str]:
    from wmrl_envs.autoresearch.tasks import get_task

    return {t: str(get_task(t).split) for t in sorted({r.task_id for r in records})}


def _plot(rows: Sequence[Mapping[str, Any]], path: Path, n_catalog_train: int) -> Path:
    fig, axes = new_figure(10, 4, ncols=2)
    for ax, key, label in (
        (axes[0], "spearman_within_task", "within-task Spearman"),
        (axes[1], "pairwise_accuracy", "pairwise accuracy"),
    ):
        for tier, marker in (("small", "o"), ("full", "s")):
            pts = [(r["n_tasks"], r[tier][key]) for r in rows if r.get(tier) and r[tier].get(key) is not None]
            if not pts:
                continue
            ns = sorted({n for n, _ in pts})
            means = [np.mean([v for n2, v in pts if n2 == n]) for n in ns]
            ax.scatter(*zip(*pts), alpha=0.3, marker=marker)
            ax.plot(ns, means, marker=marker, label=f"held-out {tier}-tier tasks")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("training tasks (catalog train split + corpus)")
        ax.set_ylabel(label)
        ax.axvline(n_catalog_train, color="grey", ls=":", lw=1)
        ax.grid(alpha=0.3)
    axes[1].axhline(0.615, color="red", ls="--", lw=1, label="ForeAgent 61.5%")
    axes[0].axhline(0.85, color="red", ls="--", lw=1, label="target 0.85")
    for ax in axes:
        ax.legend(fontsize=8)
    fig.suptitle("CodeOutcomeModel fidelity on unseen catalog tasks vs number of training tasks")
    return save_figure(fig, path)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fidelity_transfer", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="docs/results")
    p.add_argument("--variants", default="base,transfer")
    p.add_argument("--cv-variants", help="variants for the CV (default: --variants)")
    p.add_argument("--curve-variant", default="transfer")
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--curve-sizes", default="4,8,16,32,64")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--no-corpus", action="store_true")
    p.add_argument("--skip", default="", help="comma list of parts to skip: cv,split,curve")
    p.add_argument("--landmarks", action="store_true", help="records carry their task's landmarks")
    args = p.parse_args(argv)
    suffix = "_landmarks" if args.landmarks else ""
    skip = set(filter(None, args.skip.split(",")))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    cat, corp = load_all(not args.no_corpus)
    if args.landmarks:
        cat, corp = with_landmarks(cat), with_landmarks(corp)
    split = _split(cat)
    train = [r for r in cat if split[r.task_id] == "train"] + corp
    test = [r for r in cat if split[r.task_id] == "test"]
    result: dict[str, Any] = {
        "command": "python -m benchmarks.fidelity_transfer " + " ".join(sys.argv[1:] if argv is None else argv),
        "n_catalog_tasks": len(split),
        "n_corpus_tasks": len({r.task_id for r in corp}),
        "n_corpus_records": len(corp),
        "variants": {k: dict(v) for k, v in VARIANTS.items()},
    }
    variants = args.variants.split(",")
    if "split" not in skip:
        result["fixed_split"] = {
            "default (shipped)": _by_tier(predict_records(CodeOutcomeModel.load_default(), test), test)
        }
        sandbox = float(np.mean([r.outcome.cost for r in test if r.outcome is not None and r.outcome.cost > 0]))
        for name in variants:
            t0 = time.time()
            model = _fit(VARIANTS[name])(train)
            fit_s = time.time() - t0
            t0 = time.perf_counter()
            preds = predict_records(model, test)
            per = (time.perf_counter() - t0) / len(test)
            result["fixed_split"][name] = _by_tier(preds, test) | {
                "fit_seconds": fit_s,
                "predict_seconds_per_solution": per,
                "sandbox_seconds_per_solution_logged": sandbox,
                "gradings_per_second_ratio": sandbox / per,
            }
            print(
                name,
                "fixed split",
                json.dumps(
                    {
                        t: round(v["spearman_within_task"], 3)
                        for t, v in result["fixed_split"][name].items()
                        if isinstance(v, dict)
                    }
                ),
                flush=True,
            )
    _save(out / f"fidelity_transfer{suffix}.json", result)
    if "cv" not in skip:
        result["leave_datasets_out"] = {}
        everything = cat + corp
        for name in (args.cv_variants or args.variants).split(","):
            preds = leave_tasks_out(everything, _fit(VARIANTS[name]), n_folds=args.folds)
            result["leave_datasets_out"][name] = _by_tier(preds, everything)
            if VARIANTS[name].get("n_ensemble", 1) > 1:  # confidence: does low confidence flag errors, pick anchors?
                result["leave_datasets_out"][name]["anchor_preference"] = anchor_preference_simulation(
                    preds, everything
                )
            print(
                name,
                "cv",
                json.dumps(
                    {
                        t: round(v["spearman_within_task"], 3)
                        for t, v in result["leave_datasets_out"][name].items()
                        if t in ("small", "full", "corpus")
                    }
                ),
                flush=True,
            )
    _save(out / f"fidelity_transfer{suffix}.json", result)
    if "curve" not in skip:
        sizes = [int(x) for x in args.curve_sizes.split(",")]
        n_train_tasks = len({r.task_id for r in train})
        sizes = sorted({min(n, n_train_tasks) for n in sizes})
        fit = _fit(VARIANTS[args.curve_variant])
        result["learning_curve"] = _curve_by_tier(train, test, fit, sizes, args.repeats)
        result["curve_plot"] = str(
            _plot(
                result["learning_curve"],
                out / f"fidelity_transfer_curve{suffix}.png",
                len({r.task_id for r in cat if split[r.task_id] == "train"}),
            )
        )
    result["total_seconds"] = time.time() - started
    _save(out / f"fidelity_transfer{suffix}.json", result)
    return result


def _save(path: Path, result: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")


def _curve_by_tier(  # learning_curve's protocol, with the metrics split by tier
    train: Sequence[LogRecord], test: Sequence[LogRecord], fit: Any, sizes: Sequence[int], repeats: int
) -> list[dict[str, Any]]:
    tasks = sorted({r.task_id for r in train})
    rng = np.random.default_rng(0)
    rows = []
    for n in sizes:
        for rep in range(repeats if n < len(tasks) else 1):
            pick = set(rng.permutation(tasks)[:n].tolist())
            model = fit([r for r in train if r.task_id in pick])
            tiers = _by_tier(predict_records(model, test), test)
            rows.append({"n_tasks": n, "repeat": rep, **tiers})
            print("curve", n, rep, {t: round(v["spearman_within_task"], 3) for t, v in tiers.items()}, flush=True)
    return rows


if __name__ == "__main__":
    main()
