"""Peak RSS and CPU of the host-side grader on hostile ``submission.csv`` files.

Each payload is graded in a fresh ``python`` process (so one payload's garbage cannot
hide another's peak): the process imports the grader, records its resident high-water
mark, grades the payload against a shipped task, and reports the peak again. The grading
cost of a submission is ``peak - baseline``; the bound the project documents is the
absolute peak (what a grading worker needs)::

    python -m benchmarks.grader_bound [--task digits] [--json out.json]

Payloads (all at the largest size the limits let through, or just past it):

* ``wide_header``: 16 MiB with one 8M-field header line (the original attack);
* ``wide_header_in_line_limit``: a 32k-field header within the line-length limit;
* ``string_cells``: as many rows as allowed, each at the line limit with long string ids
  (object columns, the most expensive well-shaped parse);
* ``long_line``: 16 MiB, a single line of digits;
* ``many_lines``: 16 MiB of ``\\n`` (16M empty lines);
* ``oversized``: 17 MiB (over the size limit; reported by the sandbox, never read);
* ``max_valid_shape``: a well-formed submission padded to the largest allowed size
  (every row at the per-line limit, as many rows as allowed);
* ``valid``: the task's own sample submission.

Functions: :func:`payload`, :func:`measure_payload`, :func:`main`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap

__all__ = ["PAYLOADS", "payload", "measure_payload", "main"]

PAYLOADS = (
    "valid",
    "wide_header",
    "wide_header_in_line_limit",
    "long_line",
    "many_lines",
    "oversized",
    "max_valid_shape",
    "string_cells",
)

_CHILD = textwrap.dedent(
    """
    import json, sys, time
    from wmrl_envs.autoresearch.grading import outcome_from_execution
    from wmrl_envs.autoresearch.tasks import get_task
    from wmrl_envs.sandbox.base import ExecutionResult
    from benchmarks.grader_bound import payload

    task = get_task(sys.argv[1])
    answers = task.read_answers()
    raw, oversized = payload(sys.argv[2], task, len(answers))
    files = {} if oversized else {"submission.csv": raw}
    result = ExecutionResult("ok", 0, "", "", 1.0, 1.0, 1 << 20, files=files, backend="local",
                             oversized_files={"submission.csv": len(raw)} if oversized else {})
    del raw

    def high_water():
        # VmHWM, not ru_maxrss: Linux carries ru_maxrss across execve, so a child started from
        # a large process (pytest with torch loaded) would report its parent's size.
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024

    base = high_water()
    t0 = time.process_time()
    out = outcome_from_execution(task, result, [0.5], answers=answers)
    cpu = time.process_time() - t0
    peak = high_water()
    print(json.dumps({"status": out.status, "reason": out.metrics.get("invalid_reason", ""),
                      "feedback_chars": len(out.feedback), "baseline_rss": base, "peak_rss": peak,
                      "cpu_seconds": round(cpu, 3)}))
    """
)


def payload(name: str, task, n_rows: int) -> tuple[bytes, bool]:
    """``(bytes, oversized)`` of payload ``name`` for ``task`` with ``n_rows`` test rows."""
    from wmrl_envs.autoresearch.bounded import SubmissionLimits

    lim = SubmissionLimits()
    if name == "valid":
        return (task.public_dir / "sample_submission.csv").read_bytes(), False
    if name == "wide_header":
        return (b"c," * (lim.max_bytes // 2))[: lim.max_bytes - 1] + b"\n", False
    if name == "wide_header_in_line_limit":
        return (b"c," * (lim.max_line_bytes // 2))[: lim.max_line_bytes] + b"\n" + b"1\n" * n_rows, False
    if name == "string_cells":
        ids = [b"x" * (lim.max_bytes // (n_rows + 2) - 4) + str(i).encode() for i in range(n_rows)]
        header = b",".join(c.encode() for c in task.submission_columns)
        return (header + b"\n" + b"\n".join(i + b",a" * (len(task.submission_columns) - 1) for i in ids) + b"\n")[
            : lim.max_bytes
        ], False
    if name == "long_line":
        return b"7" * lim.max_bytes, False
    if name == "many_lines":
        return b"\n" * lim.max_bytes, False
    if name == "oversized":
        return b"0" * (lim.max_bytes + (1 << 20)), True
    if name == "max_valid_shape":
        sample = (task.public_dir / "sample_submission.csv").read_bytes().split(b"\n")
        header, rows = sample[0], [r for r in sample[1:] if r]
        width = min(lim.max_line_bytes, lim.max_bytes // (n_rows + lim.slack_lines + 2))
        pad = [r + b"0" * max(0, width - len(r)) if b"." in r else r for r in rows]
        return (header + b"\n" + b"\n".join(pad) + b"\n")[: lim.max_bytes], False
    raise ValueError(f"unknown payload {name!r}; choose one of {PAYLOADS}")


def measure_payload(name: str, task_id: str = "digits", python: str = sys.executable) -> dict:
    """Grade payload ``name`` in a fresh process; its JSON report plus the payload name."""
    proc = subprocess.run([python, "-c", _CHILD, task_id, name], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"grading payload {name!r} failed: {proc.stderr.strip()[-2000:]}")
    return {"payload": name, **json.loads(proc.stdout.strip().splitlines()[-1])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="digits", help="task to grade against (default digits: 10 classes)")
    parser.add_argument("--payloads", default=",".join(PAYLOADS))
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    rows = [measure_payload(p, args.task) for p in args.payloads.split(",")]
    print("| payload | status | peak RSS (MiB) | grading cost (MiB) | CPU (s) | feedback chars | reason |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['payload']} | {r['status']} | {r['peak_rss'] / 2**20:.0f} | "
            f"{(r['peak_rss'] - r['baseline_rss']) / 2**20:.0f} | {r['cpu_seconds']:.2f} | "
            f"{r['feedback_chars']} | {r['reason'][:90]} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
