"""Sandbox API: validation, the pool, the no-bwrap fallback, status classification, image helpers."""

from __future__ import annotations

import dataclasses
import json
import signal
import threading

import pytest
from sandbox_helpers import HIDDEN_PROBE, SMALL, TEST_UIDS, local_executor, public_tmp, write_hidden_labels  # noqa: F401

from wmrl_envs.sandbox import (
    STATUSES,
    DockerExecutor,
    ExecutionResult,
    Executor,
    ExecutorPool,
    Job,
    Limits,
    LocalExecutor,
    SandboxUnavailable,
    default_executor,
)
from wmrl_envs.sandbox.base import classify_exit
from wmrl_envs.sandbox.image import apt_mirror, image_tag

# -- values and validation ---------------------------------------------------------------


def test_limits_defaults_match_contract():
    lim = Limits()
    assert (
        lim.wall_seconds,
        lim.cpu_seconds,
        lim.memory_bytes,
        lim.max_processes,
        lim.max_file_bytes,
        lim.max_output_bytes,
        lim.tail_bytes,
    ) == (60, 60, 2 << 30, 64, 256 << 20, 1 << 20, 8192)


@pytest.mark.parametrize(
    "field,value",
    [
        ("wall_seconds", 0),
        ("cpu_seconds", -1),
        ("wall_seconds", "5"),
        ("memory_bytes", 1024),
        ("max_processes", 0),
        ("max_output_bytes", 1.5),
        ("tail_bytes", -1),
        ("max_processes", True),
    ],
)
def test_limits_reject_bad_values_by_name(field, value):
    with pytest.raises(ValueError, match=f"Limits.{field}"):
        Limits(**{field: value})


def test_execution_result_rejects_unknown_status():
    with pytest.raises(ValueError, match="status"):
        ExecutionResult("crashed", 1, "", "", 0.1, None, None)
    assert STATUSES == ("ok", "error", "timeout", "killed_memory", "killed_limit")


@pytest.mark.parametrize(
    "inputs,outputs,match",
    [
        ({"../escape.csv": __file__}, (), "input path must be relative"),
        ({"/abs.csv": __file__}, (), "input path must be relative"),
        ({"main.py": __file__}, (), "reserved"),
        ({}, ("../../etc/passwd",), "output path must be relative"),
        ({}, ("",), "non-empty"),
        ({}, (".",), "must name a file"),
    ],
)
def test_run_rejects_paths_leaving_the_work_dir(local_executor, inputs, outputs, match):
    with pytest.raises(ValueError, match=match):
        local_executor.run("pass", inputs=inputs, outputs=outputs, limits=SMALL)


def test_run_rejects_missing_input_and_string_outputs(local_executor, tmp_path):
    with pytest.raises(FileNotFoundError, match="data/x.csv"):
        local_executor.run("pass", inputs={"data/x.csv": tmp_path / "nope.csv"}, limits=SMALL)
    with pytest.raises(TypeError, match="outputs must be a sequence"):
        local_executor.run("pass", outputs="submission.csv", limits=SMALL)
    with pytest.raises(TypeError, match="limits"):
        local_executor.run("pass", limits={"wall_seconds": 1})


def test_input_directory_is_copied(local_executor, tmp_path):
    d = tmp_path / "data"
    (d / "sub").mkdir(parents=True)
    (d / "sub" / "a.txt").write_text("A")
    r = local_executor.run("print(open('input/sub/a.txt').read())", inputs={"input": d}, limits=SMALL)
    assert r.status == "ok" and r.stdout_tail == "A\n"


def test_workdir_is_removed_after_the_run(tmp_path, public_tmp):
    with pytest.raises(ValueError, match="not world-traversable"):
        LocalExecutor(TEST_UIDS, work_base=str(tmp_path))  # pytest's tmp dirs are mode 0700
    ex = LocalExecutor(TEST_UIDS, strict=True, work_base=str(public_tmp))
    r = ex.run("open('out.txt', 'w').write('x')\nimport os\nos.makedirs('deep/er')", outputs=["out.txt"], limits=SMALL)
    assert r.status == "ok" and r.files == {"out.txt": b"x"}
    assert list(public_tmp.iterdir()) == []


def test_executors_satisfy_protocol(local_executor):
    assert isinstance(local_executor, Executor)
    assert isinstance(LocalExecutor, type) and hasattr(DockerExecutor, "run")


def test_default_executor_selects_backend(monkeypatch):
    monkeypatch.setenv("WMRL_SANDBOX", "local")
    assert isinstance(default_executor(), LocalExecutor)
    monkeypatch.setenv("WMRL_SANDBOX", "podman")
    with pytest.raises(ValueError, match="podman.*WMRL_SANDBOX"):
        default_executor()
    with pytest.raises(ValueError, match="unknown sandbox backend 'nope'"):
        default_executor("nope")


# -- the uid, the environment, concurrency ----------------------------------------------


def test_runs_as_non_root_with_clean_environment(local_executor):
    script = "import os, json\nprint(json.dumps({'uid': os.getuid(), 'env': dict(os.environ), 'cwd': os.getcwd()}))"
    r = local_executor.run(script, limits=SMALL)
    info = json.loads(r.stdout_tail)
    assert info["uid"] in range(TEST_UIDS.uid_base, TEST_UIDS.uid_base + TEST_UIDS.uid_count)
    assert info["cwd"] == "/sandbox"
    assert info["env"]["HOME"] == "/tmp" and "VIRTUAL_ENV" not in info["env"]
    assert not any(k.startswith(("PYTEST", "WMRL")) for k in info["env"])


def test_pool_caps_concurrency_and_keeps_order(local_executor):
    script = "import time, os\nt0 = time.time()\ntime.sleep(0.6)\nprint({i}, os.getuid(), t0, time.time())"
    jobs = [Job(script.format(i=i), limits=SMALL) for i in range(5)]
    with ExecutorPool(local_executor, max_concurrent=2) as pool:
        results = pool.map(jobs)
    rows = [r.stdout_tail.split() for r in results]
    assert [int(row[0]) for row in rows] == list(range(5))
    spans = [(float(a), float(b), int(uid)) for _, uid, a, b in rows]
    overlap = max(sum(1 for s, e, _ in spans if s <= t < e) for t, _, _ in spans)
    assert overlap == 2  # ran concurrently, never more than the cap
    for (_s1, e1, u1), (s2, _e2, u2) in zip(spans, spans[1:]):
        if s2 < e1:
            assert u1 != u2  # overlapping runs never share a uid (RLIMIT_NPROC is per uid)


def test_pool_validates_arguments(local_executor):
    with pytest.raises(ValueError, match="max_concurrent"):
        ExecutorPool(local_executor, max_concurrent=0)
    with pytest.raises(TypeError, match="Executor"):
        ExecutorPool(object())
    with ExecutorPool(local_executor) as pool, pytest.raises(TypeError, match="Job"):
        pool.submit(("print(1)",))


def test_pool_propagates_bad_job(local_executor):
    with ExecutorPool(local_executor) as pool, pytest.raises(ValueError, match="relative"):
        pool.map([Job("print(1)", limits=SMALL), Job("print(2)", outputs=["/etc/passwd"], limits=SMALL)])


def test_uid_pool_waits_when_every_uid_is_busy(tmp_path):
    ex = LocalExecutor(dataclasses.replace(TEST_UIDS, uid_count=1, lock_dir=str(tmp_path / "locks")), strict=True)
    script = "import time\nt0 = time.time()\ntime.sleep(0.4)\nprint(t0, time.time())"
    results = []
    threads = [threading.Thread(target=lambda: results.append(ex.run(script, limits=SMALL))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (a0, a1), (b0, b1) = sorted(tuple(map(float, r.stdout_tail.split())) for r in results)
    assert b0 >= a1  # one uid: the second run waited for the first


# -- without bubblewrap ---------------------------------------------------------------


def test_missing_bwrap_refuses_by_default(monkeypatch):
    monkeypatch.delenv("WMRL_SANDBOX_UNSAFE_NO_ISOLATION", raising=False)
    for strict in (True, False):  # strict or not: no unisolated fallback without the unsafe opt-out
        with pytest.raises(SandboxUnavailable, match="bubblewrap.*not installed.*unsafe_no_isolation=True"):
            LocalExecutor(TEST_UIDS, bwrap="/nonexistent/bwrap", strict=strict)


def test_missing_bwrap_with_unsafe_opt_out_warns_loudly_and_still_limits(public_tmp):
    with pytest.warns(RuntimeWarning, match="unsafe_no_isolation.*NETWORK isolation.*FILESYSTEM isolation"):
        ex = LocalExecutor(TEST_UIDS, bwrap="/nonexistent/bwrap", unsafe_no_isolation=True)
    assert not ex.sandboxed and ex.backend == "local-unsandboxed"
    r = ex.run("import os\nopen('s.csv', 'w').write('1')\nprint(os.getuid())", outputs=["s.csv"], limits=SMALL)
    assert r.status == "ok" and r.files == {"s.csv": b"1"} and int(r.stdout_tail) >= TEST_UIDS.uid_base
    assert r.backend == "local-unsandboxed"
    bomb = ex.run("hog = []\nwhile True:\n    hog.append(bytearray(16 << 20))\n", limits=SMALL)
    assert bomb.status == "killed_memory"
    loop = ex.run("while True:\n    pass\n", limits=dataclasses.replace(SMALL, cpu_seconds=1, wall_seconds=20))
    assert loop.status == "timeout"
    # What the warning means: without namespaces a world-readable host file is exposed
    # (the same probe is DENIED under both real backends in test_sandbox_hostile.py).
    labels = write_hidden_labels(public_tmp)
    leak = ex.run(HIDDEN_PROBE.format(labels=str(labels)), limits=SMALL)
    assert "SECRET-LABEL-7f3a" in leak.stdout_tail


# -- status classification ------------------------------------------------------------


@pytest.mark.parametrize(
    "rc,stderr,cpu,expected",
    [
        (0, "", 0.1, "ok"),
        (1, "Traceback...\nValueError: x\n", 0.1, "error"),
        (1, "Traceback...\nMemoryError\n", 0.1, "killed_memory"),
        (1, "numpy.core._exceptions._ArrayMemoryError: Unable to allocate 8 GiB", 0.1, "killed_memory"),
        (1, "OSError: [Errno 27] File too large\n", 0.1, "killed_limit"),
        (1, "BlockingIOError: [Errno 11] Resource temporarily unavailable\n", 0.1, "killed_limit"),
        (-signal.SIGXCPU, "", 1.0, "timeout"),
        (-signal.SIGKILL, "", 1.9, "timeout"),
        (-signal.SIGKILL, "", 0.2, "error"),
        (-signal.SIGXFSZ, "", 0.2, "killed_limit"),
        (-signal.SIGSEGV, "", 0.2, "error"),
        (3, "", None, "error"),
    ],
)
def test_classify_exit(rc, stderr, cpu, expected):
    status, reason = classify_exit(rc, stderr, cpu, Limits(cpu_seconds=2))
    assert status == expected
    assert (reason == "") == (expected == "ok")


# -- image helpers --------------------------------------------------------------------


def test_apt_mirror_reads_one_line_and_deb822_sources(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list").write_text("# comment\ndeb [arch=amd64] http://mirror.example/debian bookworm main\n")
    assert apt_mirror("bookworm", str(tmp_path)) == "http://mirror.example/debian"
    (tmp_path / "sources.list").write_text("")
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://sec.example/debian-security\nSuites: bookworm-security\n\n"
        "Types: deb\nURIs: http://deb.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n"
    )
    assert apt_mirror("bookworm", str(tmp_path)) == "http://deb.example/debian"
    assert apt_mirror("trixie", str(tmp_path)) == "http://deb.debian.org/debian"


def test_image_tag_names_suite_and_revision():
    assert image_tag("bookworm").startswith("wmrl-sandbox:bookworm-")


def test_docker_missing_image_names_the_build_command():
    from wmrl_envs.sandbox.image import docker_client

    try:
        docker_client()
    except SandboxUnavailable as e:
        pytest.skip(f"no Docker engine reachable: {e}")
    with pytest.raises(
        SandboxUnavailable, match=r"python -m wmrl_envs.sandbox.cli build-image --tag wmrl-sandbox:nope"
    ):
        DockerExecutor(image="wmrl-sandbox:nope")


def test_docker_without_visible_cgroups_reports_unknown_usage(monkeypatch):
    """A remote engine's cgroups are not readable here: the run works, usage is None (unknown)."""
    from wmrl_envs.sandbox import docker_backend
    from wmrl_envs.sandbox.image import docker_client

    try:
        docker_client()
    except SandboxUnavailable as e:
        pytest.skip(f"no Docker engine reachable: {e}")
    monkeypatch.setattr(docker_backend._ContainerCgroup, "visible", staticmethod(lambda: False))
    ex = DockerExecutor()
    r = ex.run("print('hi')", limits=SMALL)
    assert (r.status, r.stdout_tail, r.cpu_seconds, r.peak_rss_bytes) == ("ok", "hi\n", None, None)
    slow = ex.run("import time\ntime.sleep(60)", limits=dataclasses.replace(SMALL, wall_seconds=1))
    assert slow.status == "timeout" and slow.wall_seconds < 5
