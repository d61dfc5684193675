"""Launch overhead of each sandbox backend against a bare ``python3 -c pass``.

Runs the empty script ``N`` times per backend (after warm-up runs), measured from the
caller's side (submission to result, including work-dir setup, output read-back and
cleanup), and prints medians side by side::

    python -m benchmarks.sandbox_overhead [--runs 20] [--backends bare,local,docker] [--json out.json]

A backend that cannot run here (no engine, no image) gets a row saying why.

Functions: :func:`measure`, :func:`main`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from tqdm.auto import tqdm

__all__ = ["measure", "main"]

PYTHON = "/usr/bin/python3"  # the interpreter both sandboxes run


def measure(fn: Callable[[], object], runs: int, warmup: int, desc: str) -> list[float]:
    """Wall seconds of ``runs`` calls of ``fn`` after ``warmup`` unmeasured ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in tqdm(range(runs), desc=desc, leave=False):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def _runner(name: str) -> Callable[[], object]:
    if name == "bare":
        return lambda: subprocess.run([PYTHON, "-c", "pass"], check=True)
    from wmrl_envs.sandbox import Limits, default_executor

    executor = default_executor(name)
    limits = Limits(wall_seconds=30)

    def run():
        result = executor.run("pass", limits=limits)
        if not result.ok:
            raise RuntimeError(f"{name}: the empty script failed: {result.status} {result.reason} {result.stderr_tail}")
        return result

    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="measured runs per backend (default 20)")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured runs first (default 2)")
    parser.add_argument("--backends", default="bare,local,docker", help="comma-separated subset of bare,local,docker")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.backends.split(",") if n.strip()]
    unknown = set(names) - {"bare", "local", "docker"}
    if unknown or args.runs < 1:
        parser.error(f"unknown backends {sorted(unknown)}" if unknown else "--runs must be >= 1")

    rows = []
    for name in names:
        try:
            times = measure(_runner(name), args.runs, args.warmup, name)
        except Exception as e:  # a backend unavailable here: say why, keep the others
            rows.append({"backend": name, "error": f"{type(e).__name__}: {e}".splitlines()[0]})
            continue
        rows.append(
            {
                "backend": name,
                "runs": len(times),
                "median_ms": 1e3 * statistics.median(times),
                "p10_ms": 1e3 * _quantile(times, 0.1),
                "p90_ms": 1e3 * _quantile(times, 0.9),
            }
        )
    bare = next((r["median_ms"] for r in rows if r["backend"] == "bare" and "median_ms" in r), None)
    for r in rows:
        if "median_ms" in r and bare is not None:
            r["overhead_ms"] = r["median_ms"] - bare
            r["ratio_vs_bare"] = r["median_ms"] / bare

    print(f"\nLaunch overhead of an empty script ({args.runs} runs each, medians; caller-side wall time)")
    print(f"{'backend':<8} {'median ms':>10} {'p10 ms':>8} {'p90 ms':>8} {'overhead ms':>12} {'x bare':>7}")
    for r in rows:
        if "error" in r:
            print(f"{r['backend']:<8} unavailable: {r['error']}")
            continue
        over = f"{r['overhead_ms']:12.1f}" if "overhead_ms" in r else f"{'n/a':>12}"
        ratio = f"{r['ratio_vs_bare']:7.1f}" if "ratio_vs_bare" in r else f"{'n/a':>7}"
        print(f"{r['backend']:<8} {r['median_ms']:10.1f} {r['p10_ms']:8.1f} {r['p90_ms']:8.1f} {over} {ratio}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


if __name__ == "__main__":
    sys.exit(main())
