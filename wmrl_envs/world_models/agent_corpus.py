"""Agent-style execution logs: scripts written the way agents write them, run for real.

The template pool teaches a world model one way of writing a solution. This corpus adds the
ways agents write them (:mod:`wmrl_envs.autoresearch.plans`: pipelines, pandas
preprocessing, encodings, LightGBM / XGBoost, searches, ensembles, and their mistakes) and
scripts built to game a code-reading model (the exploit families), each executed in the
sandbox under the pinned runtime and graded against the catalog's leaderboards.

**Splits, fixed before anything ran.** :data:`HELDOUT_TABLES` (the 13 catalog test-split
tables: regression / binary / multiclass, small and full tier) and :data:`HELDOUT_FAMILIES` (the
``encoding`` family) are never used to fit the model that is evaluated on them; exploit
scripts (:data:`EXPLOIT_TABLES`) are never used for fitting at all. :func:`corpus_jobs` is
deterministic, so a run is reproducible and resumable: each finished job appends one record
to ``runs.jsonl.gz`` (a gzip member per record), and a restart skips the job ids already
there.

**Limits.** Runs get tighter limits than the catalog's (:data:`CORPUS_LIMITS`: 20 s on the
small tier, 30 s on the full tier, 1 GiB), recorded in each record's context, so time and
memory failures are frequent and cheap. As in :mod:`~wmrl_envs.world_models.corpus`, the
wall budget is 2.5x the CPU budget, and a timeout that used less than 90% of its CPU budget
(starved by other processes) is logged as unknown (``None``), never as a label.

Run it niced in the background (resumable; ``--budget-minutes`` stops starting new jobs)::

    nice -n 19 wmrl-wm grow-agent-corpus --budget-minutes 60 --workers 2 &

More scripts for fitting only: another draw of plans on the train-split tables (``--seed 1
--train-tables``; job ids name the plan, so a second draw never repeats a first draw's run).

Functions: :func:`corpus_jobs`, :func:`grow_agent_corpus`, :func:`read_agent_corpus`,
:func:`agent_corpus_path`. Constants: :data:`HELDOUT_TABLES`, :data:`HELDOUT_FAMILIES`,
:data:`EXPLOIT_TABLES`, :data:`CORPUS_LIMITS`.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from wmrl_envs.world_models.logs import LogRecord

__all__ = [
    "HELDOUT_TABLES",
    "HELDOUT_FAMILIES",
    "EXPLOIT_TABLES",
    "CORPUS_LIMITS",
    "corpus_jobs",
    "grow_agent_corpus",
    "read_agent_corpus",
    "agent_corpus_path",
    "split_of",
]

#: Catalog tables whose agent-style runs are only ever evaluation data: the catalog's test
#: split of both tiers, as for the template logs, so one fitted model is out of sample on both.
HELDOUT_TABLES = (
    "ames", "chile", "credit_data", "diabetes", "diamonds_cut", "loans_interest", "oj", "swiss_labor", "wine",
    "births_day", "diamonds_price", "inst_eval", "nass_dead",
)  # fmt: skip
#: Script families whose runs are only ever evaluation data.
HELDOUT_FAMILIES = ("encoding",)
#: Held-out tables that also get the exploit suite (with an honest strong and a prior-only script).
EXPLOIT_TABLES = ("credit_data", "oj", "chile", "diabetes")
#: Limits of one corpus run, by catalog tier: (CPU = nominal wall seconds, memory bytes).
CORPUS_LIMITS = {"small": (20.0, 1 << 30), "full": (30.0, 1 << 30)}
_WALL_FACTOR = 2.5
_PLANS_PER_TABLE = {("small", False): 16, ("full", False): 10, ("small", True): 32, ("full", True): 16}


def agent_corpus_path() -> Path:
    """The shipped agent-style log file."""
    return Path(__file__).parent / "agent_corpus" / "runs.jsonl.gz"


def split_of(task_id: str, origin: str, family: str | None) -> str:
    """``"exploit"``, ``"heldout"`` (held-out table or family) or ``"train"``."""
    if origin == "agent-exploit":
        return "exploit"
    if task_id in HELDOUT_TABLES or family in HELDOUT_FAMILIES:
        return "heldout"
    return "train"


def _seed(*parts: Any) -> int:
    return int(hashlib.sha1("/".join(map(str, parts)).encode()).hexdigest()[:8], 16)


def corpus_jobs(seed: int = 0, tasks: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """The deterministic job list: ``{"job_id", "task_id", "origin", "code", "plan"|"exploit"}``,
    interleaved across tables so a partial run covers every table."""
    from wmrl_envs.autoresearch.plans import EXPLOITS, Plan, plan_id, render, render_exploit, sample_plan
    from wmrl_envs.autoresearch.tasks import get_task, list_catalog

    per_task: list[list[dict[str, Any]]] = []
    for tid in tasks or list_catalog(None, None):
        task = get_task(tid)
        rng = random.Random(_seed(seed, tid))
        n = _PLANS_PER_TABLE[(task.tier or "small", tid in HELDOUT_TABLES)]
        jobs: list[dict[str, Any]] = []
        seen: set[str] = set()
        while len(jobs) < n:
            plan = sample_plan(rng, task)
            code = render(plan, task)
            key = hashlib.sha1(code.encode()).hexdigest()[:12]
            if key in seen:
                continue
            seen.add(key)
            jobs.append(
                {
                    "job_id": f"{tid}/plan/{plan_id(plan)}",
                    "task_id": tid,
                    "origin": "agent-style",
                    "code": code,
                    "plan": asdict(plan),
                }
            )
        if tid in EXPLOIT_TABLES:
            for kind in EXPLOITS:
                code = render_exploit(kind, task, random.Random(_seed(seed, tid, kind)))
                jobs.append(
                    {
                        "job_id": f"{tid}/exploit/{kind}",
                        "task_id": tid,
                        "origin": "agent-exploit",
                        "code": code,
                        "exploit": kind,
                    }
                )
            honest = Plan(family="pipeline", model="hist_gb", encode="ordinal",
                          params={"learning_rate": 0.05, "max_iter": 300, "max_leaf_nodes": 31, "l2_regularization": 1.0})  # fmt: skip
            jobs.append({"job_id": f"{tid}/exploit/honest_strong", "task_id": tid, "origin": "agent-exploit", "code": render(honest, task), "exploit": "honest_strong"})  # fmt: skip
        per_task.append(jobs)
    out: list[dict[str, Any]] = []
    for i in range(max((len(j) for j in per_task), default=0)):
        out += [jobs[i] for jobs in per_task if i < len(jobs)]
    return out


def _run_job(job: dict[str, Any], executor: Any) -> dict[str, Any]:
    from wmrl_envs.autoresearch.grading import check_syntax, grading_context, harness_failed, outcome_from_execution
    from wmrl_envs.autoresearch.leaderboard import load_leaderboard
    from wmrl_envs.autoresearch.tasks import get_task
    from wmrl_envs.sandbox import Limits

    task = get_task(job["task_id"])
    cpu, memory = CORPUS_LIMITS[task.tier or "small"]
    limits = Limits(wall_seconds=_WALL_FACTOR * cpu, cpu_seconds=cpu, memory_bytes=memory)
    outcome = check_syntax(job["code"])
    if outcome is None:
        result = executor.run(job["code"], inputs=task.inputs(), outputs=("submission.csv",), limits=limits)
        if harness_failed(result):
            outcome = None
        else:
            outcome = outcome_from_execution(task, result, load_leaderboard(task))
            # A timeout that used under 90% of its CPU budget was starved by other processes --
            # except a script that sleeps by design (the sleep exploit), whose timeout is real.
            starved = outcome.status == "timeout" and (result.cpu_seconds is None or result.cpu_seconds < 0.9 * cpu)
            if starved and job.get("exploit") != "sleep_first":
                outcome = None
    context = grading_context(task, limits={"wall_seconds": cpu, "memory_bytes": memory})
    extra: dict[str, Any] = {k: job[k] for k in ("plan", "exploit") if k in job}
    return {
        "task_id": task.task_id,
        "solution_id": job["job_id"],
        "code": job["code"],
        "context": context,
        "outcome": None if outcome is None else outcome.to_dict(),
        "origin": job["origin"],
        **extra,
    }


def _done_ids(path: Path) -> set[str]:
    if not path.is_file():
        return set()
    done = set()
    with gzip.open(path, "rt") as f:
        try:
            for line in f:
                if line.strip():
                    done.add(json.loads(line)["solution_id"])
        except (EOFError, gzip.BadGzipFile, json.JSONDecodeError):
            pass  # a member cut short by a kill: the job reruns
    return done


def grow_agent_corpus(
    out: str | Path | None = None,
    *,
    budget_minutes: float = 60.0,
    workers: int = 2,
    executor: Any = None,
    seed: int = 0,
    tasks: Sequence[str] | None = None,
    progress: bool = True,
) -> dict[str, int]:
    """Run the jobs of :func:`corpus_jobs` not yet in ``out`` (default :func:`agent_corpus_path`);
    returns ``{"done": ..., "ran": ..., "left": ...}``. No job starts after ``budget_minutes``."""
    from wmrl_envs.sandbox import default_executor

    path = Path(out) if out is not None else agent_corpus_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    done = _done_ids(path)
    todo = [j for j in corpus_jobs(seed, tasks) if j["job_id"] not in done]
    executor = executor or default_executor()
    deadline = time.monotonic() + 60.0 * budget_minutes
    lock = threading.Lock()
    ran = 0
    bar = tqdm(total=len(todo), desc="agent corpus", unit="run", disable=not progress)

    def one(job: dict[str, Any]) -> None:
        nonlocal ran
        if time.monotonic() > deadline:
            return
        line = json.dumps(_run_job(job, executor)) + "\n"
        with lock:
            with gzip.open(path, "at") as f:  # one member per record: a kill loses at most one run
                f.write(line)
            ran += 1
            bar.update(1)

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        list(pool.map(one, todo))
    bar.close()
    return {"done": len(done) + ran, "ran": ran, "left": len(todo) - ran}


def read_agent_corpus(path: str | Path | None = None, splits: Iterable[str] | None = None) -> list[LogRecord]:
    """The agent-style records (optionally only those of ``splits``: train / heldout / exploit),
    with ``extra = {"split", "family", "mistakes", "exploit"}``."""
    path = Path(path) if path is not None else agent_corpus_path()
    if not path.is_file():
        return []
    wanted = set(splits) if splits is not None else None
    out = []
    with gzip.open(path, "rt") as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            d = json.loads(line)
            plan = d.get("plan") or {}
            family = plan.get("family")
            split = split_of(d["task_id"], d.get("origin", ""), family)
            if wanted is not None and split not in wanted:
                continue
            r = LogRecord.from_dict(d, where=f"{path}:{i + 1}")
            extra = {
                "split": split,
                "family": family or "exploit",
                "mistakes": list(plan.get("mistakes", [])),
                "exploit": d.get("exploit"),
            }
            out.append(LogRecord(r.task_id, r.code, r.context, r.outcome, r.solution_id, r.origin, extra))
    return out
