"""``wmrl-wm``: fit code-outcome world models from execution logs and report their fidelity.

::

    wmrl-wm fit --logs a.jsonl b.jsonl.gz --out model_dir [--split train] [--tier small|full] [--max-iter 200]
                [--extra-logs corpus/*.jsonl.gz] [--agent-corpus [FILE]] [--no-read-code] [--transfer-features]
                [--percentile-head regressor|ranker|both] [--n-ensemble 5] [--landmarks]
    wmrl-wm fidelity --model model_dir|default --logs held_out.jsonl [--split test] [--tier small|full] [--markdown out.md]
                     [--halves 5]
    wmrl-wm update --model model_dir --logs anchors.jsonl --out model_dir2
    nice -n 19 wmrl-wm grow-corpus [--budget-minutes 60] [--max-tasks N] [--out DIR]
    nice -n 19 wmrl-wm grow-agent-corpus [--budget-minutes 60] [--workers 2] [--out FILE.jsonl.gz]

``--split`` keeps only records whose task belongs to that catalog split: the record's
``context["split"]`` when present, else the AutoResearch catalog's split of its task.
``--tier`` keeps only records whose task belongs to that catalog tier (``small``: the
2,500-row catalog, ``full``: the full-size tables); both tiers when absent.
``--landmarks`` fills the landmark meta-features (:mod:`wmrl_envs.world_models.landmarks`) of
logged tasks into records written before grading contexts carried them, so the model learns
from them; ``fidelity`` and ``update`` always fill them (a model fitted without them ignores
them), computing them from ``--task-root DIR/<task_id>`` for tasks the shipped table lacks
(bring-your-own tasks), and warn, naming the tasks, when some stay unknown. ``fidelity`` computes its ranking numbers on a seeded half of the records (the other half
calibrates); on a few held-out tasks one half is noisy, so ``--halves N`` also reports the
within-task Spearman on the halves of seeds ``seed .. seed+N-1`` and their mean (what a
replacement of the default is judged on). ``python -m wmrl_envs.world_models.cli`` is the
same command.

Functions: :func:`main`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from wmrl_envs.config_cli import run_cli
from wmrl_envs.world_models.code_outcome import CodeOutcomeConfig, CodeOutcomeModel
from wmrl_envs.world_models.fidelity import evaluate_fidelity_halves
from wmrl_envs.world_models.landmarks import with_landmarks
from wmrl_envs.world_models.logs import LogRecord, read_logs

__all__ = ["main"]


def _catalog_field(task_id: str, name: str) -> str | None:
    try:
        from wmrl_envs.autoresearch.tasks import get_task

        return getattr(get_task(task_id), name)
    except (ImportError, ValueError, FileNotFoundError):
        return None


def _select(records: list[LogRecord], split: str | None, tier: str | None = None) -> list[LogRecord]:
    if split is None and tier is None:
        return records
    cache: dict[tuple[str, str], str | None] = {}

    def field(r: LogRecord, name: str) -> str | None:
        v = r.context.get(name)
        if isinstance(v, str):
            return v
        if (r.task_id, name) not in cache:
            cache[r.task_id, name] = _catalog_field(r.task_id, name)
        return cache[r.task_id, name]

    out = [
        r
        for r in records
        if (split is None or field(r, "split") == split) and (tier is None or field(r, "tier") == tier)
    ]
    if not out:
        raise SystemExit(
            f"no records of split {split!r} / tier {tier!r} among {len(records)} (tasks: {sorted({r.task_id for r in records})[:10]} ...)"
        )
    return out


def _load_model(spec: str) -> CodeOutcomeModel:
    return CodeOutcomeModel.load_default() if spec == "default" else CodeOutcomeModel.load(spec)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``wmrl-wm`` command; bad input is one line on stderr and exit code 2."""
    return run_cli("wmrl-wm", lambda: _command(argv))


def _command(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="wmrl-wm", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    fit = sub.add_parser("fit", help="fit a CodeOutcomeModel on execution logs")
    fit.add_argument("--logs", nargs="+", required=True, help="JSONL execution logs")
    fit.add_argument("--out", required=True, help="output model directory")
    fit.add_argument(
        "--extra-logs", nargs="+", default=[], help="logs added after --split/--tier selection (e.g. the corpus)"
    )
    fit.add_argument("--split", help="keep only tasks of this catalog split (train/test)")
    fit.add_argument("--tier", choices=("small", "full"), help="keep only tasks of this catalog tier (default: both)")
    for f in ("n_hash", "max_iter", "max_leaf_nodes", "min_samples_leaf", "seed"):
        fit.add_argument("--" + f.replace("_", "-"), type=int, default=getattr(CodeOutcomeConfig, f))
    for f in ("learning_rate", "l2_regularization", "anchor_weight"):
        fit.add_argument("--" + f.replace("_", "-"), type=float, default=getattr(CodeOutcomeConfig, f))
    fit.add_argument(
        "--no-training-data", action="store_true", help="do not store the training matrix (smaller file; no update)"
    )
    fit.add_argument("--no-size-features", action="store_true", help="leave out the size-vs-limit features (ablation)")
    fit.add_argument("--transfer-features", action="store_true", help="add the task-relative transfer features")
    fit.add_argument(
        "--no-landmark-features",
        action="store_true",
        help="leave out the own-estimator landmark features (ablation; see --landmarks for the task's landmarks)",
    )
    fit.add_argument(
        "--no-read-code", action="store_true", help="featurise the raw script, no code reading or foreseen-failure gate"
    )
    fit.add_argument(
        "--agent-corpus",
        nargs="?",
        const="shipped",
        help="add the train split of the agent-style corpus (default file: the shipped one)",
    )
    fit.add_argument("--percentile-head", choices=("regressor", "ranker", "both"), default="regressor")
    fit.add_argument("--n-ensemble", type=int, default=1, help="task-bootstrap members of the percentile head")
    fit.add_argument("--rank-rounds", type=int, default=CodeOutcomeConfig.rank_rounds)
    fit.add_argument(
        "--landmarks", action="store_true", help="fill logged tasks' landmark meta-features into old records"
    )
    fid = sub.add_parser("fidelity", help="fidelity report of a model on held-out logs")
    fid.add_argument("--model", required=True, help="model directory, or 'default' for the shipped model")
    fid.add_argument("--logs", nargs="+", required=True)
    fid.add_argument("--split", help="keep only tasks of this catalog split")
    fid.add_argument("--tier", choices=("small", "full"), help="keep only tasks of this catalog tier (default: both)")
    fid.add_argument("--name", help="column name in the table (default: 'CodeOutcomeModel (<model>)')")
    fid.add_argument("--calibration-fraction", type=float, default=0.5)
    fid.add_argument("--seed", type=int, default=0)
    fid.add_argument(
        "--halves", type=int, default=1, help="also report the within-task Spearman over this many seeded halves"
    )
    fid.add_argument("--task-root", help="directory of task directories: compute missing landmarks from them")
    fid.add_argument("--markdown", help="also write the Markdown table here")
    fid.add_argument("--json", help="also write the report as JSON here")
    upd = sub.add_parser("update", help="refit a model with extra logs (e.g. anchor outcomes)")
    upd.add_argument("--model", required=True)
    upd.add_argument("--logs", nargs="+", required=True)
    upd.add_argument("--out", required=True)
    upd.add_argument("--task-root", help="directory of task directories: compute missing landmarks from them")
    grow = sub.add_parser("grow-corpus", help="execute reference pools on new tables into the log corpus (resumable)")
    grow.add_argument("--out", help="corpus directory (default: the shipped wmrl_envs/world_models/log_corpus)")
    grow.add_argument("--budget-minutes", type=float, default=60.0, help="start no new task after this (default 60)")
    grow.add_argument("--max-tasks", type=int, help="stop after adding this many tasks")
    grow.add_argument("--task-root", help="where the tasks' files go (default: a temp dir)")
    grow.add_argument("--seed", type=int, default=0, help="order of the sources (default 0)")
    grow.add_argument("--only-large", action="store_true", help="only large variants of >= 8,000-row tables")
    agent = sub.add_parser(
        "grow-agent-corpus", help="run agent-style and exploit scripts into the agent corpus (resumable)"
    )
    agent.add_argument(
        "--out", help="log file (default: the shipped wmrl_envs/world_models/agent_corpus/runs.jsonl.gz)"
    )
    agent.add_argument("--budget-minutes", type=float, default=60.0, help="start no new run after this (default 60)")
    agent.add_argument("--workers", type=int, default=2, help="runs at once (default 2)")
    agent.add_argument("--tasks", nargs="+", help="only these catalog tasks (default: all 36)")
    agent.add_argument(
        "--seed", type=int, default=0, help="draw of the plans (default 0; another seed adds new scripts)"
    )
    agent.add_argument(
        "--train-tables", action="store_true", help="only tables outside HELDOUT_TABLES (grows the fit data only)"
    )
    args = parser.parse_args(argv)

    if args.command == "fit":
        records = _select(read_logs(args.logs), args.split, args.tier)
        records += read_logs(args.extra_logs) if args.extra_logs else []
        records = with_landmarks(records) if args.landmarks else records
        if args.agent_corpus:
            from wmrl_envs.world_models.agent_corpus import read_agent_corpus

            records += read_agent_corpus(
                None if args.agent_corpus == "shipped" else args.agent_corpus, splits=["train"]
            )
        config = CodeOutcomeConfig(
            n_hash=args.n_hash, max_iter=args.max_iter, learning_rate=args.learning_rate,
            max_leaf_nodes=args.max_leaf_nodes, min_samples_leaf=args.min_samples_leaf,
            l2_regularization=args.l2_regularization, anchor_weight=args.anchor_weight,
            keep_training_data=not args.no_training_data, seed=args.seed, size_features=not args.no_size_features,
            transfer_features=args.transfer_features, landmark_features=not args.no_landmark_features,
            percentile_head=args.percentile_head,
            n_ensemble=args.n_ensemble, rank_rounds=args.rank_rounds, read_code=not args.no_read_code,
        )  # fmt: skip
        model = CodeOutcomeModel(config).fit(records)
        model.info["training_logs"] = [Path(p).name for p in args.logs + args.extra_logs] + (
            ["agent corpus (train split)"] if args.agent_corpus else []
        )
        model.info["training_split"] = args.split
        model.info["training_tier"] = args.tier or "all"
        out = model.save(args.out)
        print(
            f"fitted on {model.info['n_used']} of {len(records)} records ({model.info['n_tasks']} tasks); saved to {out}"
        )
        print(json.dumps(model.info["status_counts"]))
    elif args.command == "fidelity":
        model = _load_model(args.model)
        records = with_landmarks(_select(read_logs(args.logs), args.split, args.tier), task_root=args.task_root)
        name = args.name or f"CodeOutcomeModel ({args.model})"
        seeds = list(range(args.seed, args.seed + max(1, args.halves)))
        reports = evaluate_fidelity_halves(
            model, records, seeds, calibration_fraction=args.calibration_fraction, name=name, progress=True
        )
        report = reports[0]
        table = report.to_markdown()
        print(table)
        result = report.to_dict()
        if len(reports) > 1:
            halves = [r.spearman_within_group for r in reports]
            known = [h for h in halves if h is not None]
            mean = sum(known) / len(known) if known else None
            result["spearman_within_group_halves"] = {"seeds": seeds, "values": halves, "mean": mean}
            shown = " ".join("n/a" if h is None else f"{h:.4f}" for h in halves)
            print(f"within-task Spearman over {len(seeds)} halves (seeds {seeds[0]}-{seeds[-1]}): {shown}; "
                  f"mean {'n/a' if mean is None else f'{mean:.4f}'}")  # fmt: skip
        if args.markdown:
            Path(args.markdown).write_text(table + "\n")
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    elif args.command == "grow-corpus":
        from wmrl_envs.world_models.corpus import grow_corpus

        state = grow_corpus(
            args.out, budget_minutes=args.budget_minutes, max_tasks=args.max_tasks, seed=args.seed,
            task_root=args.task_root, only_large=args.only_large,
        )  # fmt: skip
        print(f"corpus: {len(state['done'])} tasks logged, {len(state['skipped'])} sources skipped")
    elif args.command == "grow-agent-corpus":
        from wmrl_envs.autoresearch.tasks import list_catalog
        from wmrl_envs.world_models.agent_corpus import HELDOUT_TABLES, grow_agent_corpus

        tasks = args.tasks
        if args.train_tables:
            tasks = [t for t in (tasks or list_catalog(None, None)) if t not in HELDOUT_TABLES]
        counts = grow_agent_corpus(
            args.out, budget_minutes=args.budget_minutes, workers=args.workers, tasks=tasks, seed=args.seed
        )
        print(f"agent corpus: {counts['done']} runs logged ({counts['ran']} new), {counts['left']} left")
    else:
        model = _load_model(args.model).update(with_landmarks(read_logs(args.logs), task_root=args.task_root))
        print(f"refitted on {model.info['n_used']} records; saved to {model.save(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
