"""``wmrl-bench <experiment>`` / ``python -m benchmarks <experiment>``: run an experiment,
write ``results.json``, ``results.md``, PNG plots and ``config.json`` into a run directory
(default ``runs/<experiment>-<UTC stamp>/``), and print the tables.

Every knob is a flag (``wmrl-bench speedup --help``) and can also come from a TOML/JSON
config file (``--config speedup-main`` = ``benchmarks/configs/speedup-main.toml``; flags override it).

Functions: :func:`main`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import EXPERIMENTS, OTHER_SCRIPTS
from benchmarks.common import load_config
from benchmarks.report import make_run_dir, write_json
from wmrl_envs.config_cli import add_config_arguments, build_config, config_to_dict, one_line_warnings, plain_text

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    epilog = "Standalone measurement scripts (not experiments of this CLI):\n" + "\n".join(
        f"  python -m benchmarks.{name:<18} {text}" for name, text in OTHER_SCRIPTS.items()
    )
    parser = argparse.ArgumentParser(
        prog="wmrl-bench",
        description="Reproducible WMRL experiments: tables (Markdown + JSON) and plots in a run directory.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    for name, module in EXPERIMENTS.items():
        mod = _load(module)
        p = sub.add_parser(
            name,
            help=_summary(mod.__doc__ or ""),
            description=_summary(mod.__doc__ or "")
            + f". The full description of the method: `python -m pydoc benchmarks.{module}`; "
            "measured results and how to read them: docs/results.md.",
        )
        p.add_argument(
            "--config",
            help="TOML/JSON config file, or the name of a shipped one in benchmarks/configs/ (flags override it)",
        )
        p.add_argument("--out", default="runs", help="root of run directories (default: runs)")
        p.add_argument("--run-dir", help="exact run directory to write (default: <out>/<experiment>-<UTC stamp>)")
        p.add_argument("--no-progress", action="store_true", help="hide progress bars")
        add_config_arguments(p, mod.CONFIG)
    return parser


def _summary(doc: str) -> str:
    """The user-facing one-liner of an experiment: its docstring's first line, plain text."""
    return plain_text(doc.strip().splitlines()[0].split(": ", 1)[-1]).rstrip(".") if doc.strip() else ""


def _load(module: str) -> Any:
    import importlib

    return importlib.import_module(f"benchmarks.{module}")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    mod = _load(EXPERIMENTS[args.experiment])
    try:
        file_values = load_config(args.config) if args.config else {}
        config = build_config(mod.CONFIG, file_values, args)
    except (ValueError, FileNotFoundError, TypeError) as err:
        print(f"wmrl-bench {args.experiment}: bad configuration: {err}", file=sys.stderr)
        return 2
    if args.run_dir:
        run_dir = Path(args.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
    else:
        run_dir = make_run_dir(args.out, args.experiment)
    write_json(
        run_dir / "config.json", {"experiment": args.experiment, "config_file": args.config, **config_to_dict(config)}
    )
    print(f"wmrl-bench {args.experiment}: writing to {run_dir}", flush=True)
    with one_line_warnings():
        result = mod.run(config, run_dir, progress=not args.no_progress)
    print()
    print(result["markdown"])
    print()
    print(f"JSON:     {run_dir / 'results.json'}")
    print(f"Markdown: {run_dir / 'results.md'}")
    for plot in sorted(run_dir.glob("*.png")):
        print(f"Plot:     {plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
