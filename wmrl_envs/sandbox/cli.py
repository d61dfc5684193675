"""Command line of the sandbox (``wmrl-sandbox`` / ``python -m wmrl_envs.sandbox.cli``).

Commands:
  build-runtime [--if-missing] [--inventory]
      build the pinned solutions' runtime venv (/opt/wmrl-runtime) both backends run scripts with;
      --inventory also rewrites the committed snapshot of what it can import.
  build-image [--if-missing] [--tag T] [--suite S] [--mirror URI]
      build the Docker sandbox image offline (debootstrap + docker import).
  run SCRIPT.py [--backend local|docker|ray] [--input REL=HOST]... [--output REL]... [--wall S] ...
      run a script in the sandbox and print the result as JSON (outputs saved to --save-dir).

Functions: :func:`main`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time
from pathlib import Path

from wmrl_envs.config_cli import USER_ERRORS, run_cli
from wmrl_envs.sandbox.base import SandboxUnavailable

__all__ = ["main"]


def _build_image(args: argparse.Namespace) -> int:
    from wmrl_envs.sandbox.image import build_image

    t0 = time.monotonic()
    tag = build_image(args.tag, suite=args.suite, mirror=args.mirror, if_missing=args.if_missing)
    print(f"sandbox image {tag} ready ({time.monotonic() - t0:.0f} s)")
    return 0


def _build_runtime(args: argparse.Namespace) -> int:
    from wmrl_envs.sandbox.runtime import build_runtime, runtime_versions, write_inventory

    python = build_runtime(if_missing=args.if_missing)
    print(f"solutions' runtime ready: {python} {runtime_versions(python)}")
    if args.inventory:
        write_inventory(python)
        print("runtime inventory rewritten")
    return 0


def _run(args: argparse.Namespace) -> int:
    from wmrl_envs.sandbox import Limits, default_executor

    inputs = {}
    for item in args.input:
        rel, sep, host = item.partition("=")
        if not sep:
            raise SystemExit(f"--input expects REL=HOST_PATH, got {item!r}")
        inputs[rel] = host
    limits = Limits(wall_seconds=args.wall, cpu_seconds=args.cpu, memory_bytes=args.memory_mb << 20)
    result = default_executor(args.backend).run(
        Path(args.script).read_text(), inputs=inputs, outputs=args.output, limits=limits
    )
    if args.save_dir:
        for rel, data in result.files.items():
            dst = Path(args.save_dir, rel)
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(data)
    summary = dataclasses.asdict(result)
    summary["files"] = {rel: len(data) for rel, data in result.files.items()}
    print(json.dumps(summary, indent=2))
    return 0 if result.ok else 1


def main(argv: list[str] | None = None) -> int:
    """The ``wmrl-sandbox`` command; bad input is one line on stderr and exit code 2."""
    return run_cli("wmrl-sandbox", lambda: _command(argv), errors=(*USER_ERRORS, SandboxUnavailable))


def _command(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="wmrl-sandbox", description="wmrl-envs sandbox tools")
    sub = parser.add_subparsers(dest="command", required=True)
    rt = sub.add_parser("build-runtime", help="build the pinned solutions' runtime venv")
    rt.add_argument("--if-missing", action="store_true", help="keep a runtime built with the same pins")
    rt.add_argument("--inventory", action="store_true", help="also rewrite the committed import inventory")
    rt.set_defaults(func=_build_runtime)
    b = sub.add_parser("build-image", help="build the Docker sandbox image offline")
    b.add_argument("--if-missing", action="store_true", help="do nothing if the image exists")
    b.add_argument("--tag", default=None, help="image name (default: wmrl-sandbox:<suite>-<revision>)")
    b.add_argument("--suite", default=None, help="Debian release (default: the host's)")
    b.add_argument("--mirror", default=None, help="apt mirror URI (default: the host's)")
    b.set_defaults(func=_build_image)
    r = sub.add_parser("run", help="run a script in the sandbox, print the result as JSON")
    r.add_argument("script")
    r.add_argument(
        "--backend", choices=("local", "docker", "ray"), default=None, help="default: $WMRL_SANDBOX or local"
    )
    r.add_argument("--input", action="append", default=[], metavar="REL=HOST_PATH")
    r.add_argument("--output", action="append", default=[], metavar="REL")
    r.add_argument("--save-dir", default=None, help="where to write the returned output files")
    r.add_argument("--wall", type=float, default=60.0, help="wall seconds (default 60)")
    r.add_argument("--cpu", type=float, default=60.0, help="CPU seconds (default 60)")
    r.add_argument("--memory-mb", type=int, default=2048, help="memory cap in MiB (default 2048)")
    r.set_defaults(func=_run)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
