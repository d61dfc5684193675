"""RayExecutor on a real local Ray instance: the sandbox suite's functional cases, results
identical to the local backend, a batch through the pool, and a worker killed mid-run."""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import signal
import threading
import time

import pytest
from ray_helpers import descendants, ray_instance, ray_task_pids  # noqa: F401
from sandbox_helpers import SMALL, TEST_UIDS, local_executor, public_tmp  # noqa: F401

# The sandbox suite's functional cases, collected here again: they use this module's
# ``executor`` fixture, so each runs on Ray workers (inner backend: the local sandbox).
from test_sandbox_hostile import (  # noqa: F401
    test_exception_is_error_with_traceback,
    test_inputs_are_read_only_and_host_copy_untouched,
    test_memory_bomb_is_killed_memory,
    test_planted_symlink_output_is_not_followed,
    test_pool_runs_a_batch,
    test_process_cap_is_exact,
    test_sleeping_forever_hits_wall_limit,
    test_training_script_produces_submission,
)

from wmrl_envs.sandbox import Job, Limits, RayExecutor, SandboxHarnessError, default_executor
from wmrl_envs.sandbox.ray_executor import TASK_NAME

BACKEND_KWARGS = {"config": TEST_UIDS, "strict": True}  # the real sandbox on the workers, never the fallback


@pytest.fixture(scope="module")
def executor(ray_instance):  # noqa: F811
    return RayExecutor(backend_kwargs=BACKEND_KWARGS, max_concurrent=2)


def _same(a, b) -> None:
    """Everything but the measured times and memory is identical. A reason's parenthesised
    detail may differ: which of two watchdogs (the run's cgroup or the process's rlimit)
    stops a CPU-bound script first is a race on any backend, local runs included."""
    timing = {"wall_seconds", "cpu_seconds", "peak_rss_bytes"}
    da, db = dataclasses.asdict(a), dataclasses.asdict(b)
    da["reason"], db["reason"] = da["reason"].split(" (")[0], db["reason"].split(" (")[0]
    assert {k: v for k, v in da.items() if k not in timing} == {k: v for k, v in db.items() if k not in timing}


@pytest.mark.parametrize(
    "script,outputs,limits",
    [
        ("import sys\nprint(open('data/in/a.txt').read())\nprint('err', file=sys.stderr)", (), SMALL),
        ("open('out.txt', 'w').write('x' * 10)\nopen('big.txt', 'w').write('y' * 100)", ("out.txt", "big.txt"),
         dataclasses.replace(SMALL, max_read_bytes=50)),
        ("raise SystemExit(7)", (), SMALL),
        ("while True:\n    pass\n", (), dataclasses.replace(SMALL, cpu_seconds=1, wall_seconds=20)),
    ],
    ids=["stdout-stderr-inputs", "outputs-and-oversized", "exit-code", "cpu-timeout"],
)  # fmt: skip
def test_results_identical_to_local_backend(executor, local_executor, tmp_path, script, outputs, limits):  # noqa: F811
    (tmp_path / "d" / "in").mkdir(parents=True)
    (tmp_path / "d" / "in" / "a.txt").write_text("A-content")
    inputs = {"data": tmp_path / "d"}
    ray_result = executor.run(script, inputs=inputs, outputs=outputs, limits=limits)
    local_result = local_executor.run(script, inputs=inputs, outputs=outputs, limits=limits)
    _same(ray_result, local_result)
    assert ray_result.backend == "local"


def test_callers_errors_are_raised_unchanged_and_not_retried(executor, tmp_path):
    before = executor.stats.attempts
    with pytest.raises(FileNotFoundError, match="data/x.csv"):
        executor.run("pass", inputs={"data/x.csv": tmp_path / "nope.csv"}, limits=SMALL)
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(ValueError, match="input path must be relative"):  # raised on the worker, re-raised here
        executor.run("pass", inputs={"../escape": tmp_path / "f.txt"}, limits=SMALL)
    with pytest.raises(TypeError, match="outputs must be a sequence"):
        executor.run("pass", outputs="submission.csv", limits=SMALL)
    with pytest.raises(TypeError, match="limits"):
        executor.run("pass", limits={"wall_seconds": 1})
    assert executor.stats.attempts == before + 1  # only the worker-side error reached Ray, once


def test_solution_failures_are_never_retried(executor):
    before = dataclasses.replace(executor.stats)
    results = executor.map([Job("raise SystemExit(3)", limits=SMALL), Job("import nope", limits=SMALL)])
    assert [r.status for r in results] == ["error", "error"]
    assert executor.stats.attempts - before.attempts == 2
    assert executor.stats.harness_retries == before.harness_retries


def test_batch_through_the_pool_and_the_map(executor):
    jobs = [Job(f"print({i})", limits=dataclasses.replace(SMALL, wall_seconds=60)) for i in range(6)]
    results = executor.map(jobs)
    assert [r.stdout_tail for r in results] == [f"{i}\n" for i in range(6)]
    assert {r.status for r in results} == {"ok"}


def _kill_worker_when_running(timeout: float = 60.0) -> list[int]:
    """SIGKILL the Ray worker running a sandbox task, and the sandbox it started, as soon as
    one appears (what a node or cgroup death does); returns the worker pids killed.

    The sandbox goes too because an orphaned local-backend launcher would otherwise outlive
    its supervisor and, at its script's end, sweep the processes of its uid, which the
    retry may have been handed by then (the uid lock died with the worker)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = ray_task_pids(TASK_NAME)
        if pids:
            time.sleep(0.5)  # let the sandboxed script start
            for pid in pids:
                for victim in [pid, *descendants(pid)]:
                    try:
                        os.kill(victim, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            return pids
        time.sleep(0.05)
    return []


def test_worker_killed_mid_run_is_reported_and_retried(ray_instance, caplog):  # noqa: F811
    ex = RayExecutor(backend_kwargs=BACKEND_KWARGS, max_retries=2)
    killed: list[int] = []
    killer = threading.Thread(target=lambda: killed.extend(_kill_worker_when_running()))
    killer.start()
    with caplog.at_level(logging.WARNING, logger="wmrl_envs.sandbox.ray_executor"):
        r = ex.run("import time\ntime.sleep(2)\nprint('done')", limits=Limits(wall_seconds=60))
    killer.join()
    assert killed, "no Ray worker was seen running the sandbox task"
    assert r.status == "ok" and r.stdout_tail == "done\n", (r.status, r.reason, r.stderr_tail)
    assert ex.stats.harness_retries == 1 and ex.stats.attempts == 2 and ex.stats.runs == 1
    assert any("lost to the harness" in m and "retrying" in m for m in caplog.messages)

    # with no retries left the loss is a clean SandboxHarnessError, never a result
    no_retry = RayExecutor(backend_kwargs=BACKEND_KWARGS, max_retries=0)
    killer = threading.Thread(target=_kill_worker_when_running)
    killer.start()
    with pytest.raises(SandboxHarnessError, match="lost to the harness on all 1 attempts"):
        no_retry.run("import time\ntime.sleep(30)", limits=Limits(wall_seconds=60))
    killer.join()
    assert no_retry.stats.harness_failures == 1


def test_default_executor_selects_ray_lazily(monkeypatch):
    monkeypatch.setenv("WMRL_SANDBOX", "ray")
    monkeypatch.setenv("WMRL_RAY_INNER", "local")
    ex = default_executor()
    assert isinstance(ex, RayExecutor) and ex.inner == "local"
    assert ex._ray is None  # no Ray instance until the first run
    clone = pickle.loads(pickle.dumps(ex))  # an env holding it can go to an AsyncVectorEnv worker
    assert isinstance(clone, RayExecutor) and clone.num_cpus == ex.num_cpus
    with pytest.raises(ValueError, match="backend must be one of"):
        RayExecutor("podman")
    with pytest.raises(ValueError, match="max_concurrent"):
        RayExecutor(max_concurrent=0)


_POOL_THREAD_FIRST = """
import time
from wmrl_envs.sandbox import ExecutorPool, Job, Limits, RayExecutor
ex = RayExecutor(local_cpus=1)
with ExecutorPool(ex, max_concurrent=1) as pool:  # the first run (and ray.init) in a pool thread
    print(pool.map([Job("print(1)", limits=Limits(wall_seconds=30))])[0].stdout_tail.strip())
time.sleep(3)  # that thread is gone: a Ray instance tied to it would be dead by now
print(ex.run("print(2)", limits=Limits(wall_seconds=30)).stdout_tail.strip())
"""


def test_a_local_instance_started_from_a_pool_thread_outlives_it(ray_instance):  # noqa: F811
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # its own local instance
    out = subprocess.run(
        [sys.executable, "-c", _POOL_THREAD_FIRST], capture_output=True, text=True, timeout=300, env=env
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["1", "2"]
