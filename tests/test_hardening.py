"""Issue 13: attacks on the host and on the hidden answers, run as an attacker would.

Every attack is a real hostile script run through the real sandbox (no mocks); the host
side is checked from the host (process table, work-dir base, cgroup counters), not from
what the script prints. Sections: bounded grading, cleanup and quota, strictness and
hidden answers, wall limit inside the sandbox, cgroup limits, bring-your-own tables.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from sandbox_helpers import SMALL, TEST_UIDS, local_executor, public_tmp  # noqa: F401

from wmrl_envs.autoresearch.grading import (
    FEEDBACK_MAX_CHARS,
    SubmissionError,
    grade_script,
    outcome_from_execution,
    read_submission,
)
from wmrl_envs.autoresearch.tasks import get_task
from wmrl_envs.sandbox import ExecutionResult, LocalExecutor
from wmrl_envs.sandbox.cgroup import available as cgroup_available
from wmrl_envs.sandbox.local import LAUNCHER_SOURCE
from wmrl_envs.sandbox.uids import uid_processes
from wmrl_envs.sandbox.workfs import remove_tree

GRADE = dataclasses.replace(SMALL, max_file_bytes=32 << 20, wall_seconds=20, cpu_seconds=10)


# ---------------------------------------------------------------------------- bounded grading
@pytest.fixture(scope="module")
def task():
    return get_task("credit_data")


def _grade(task, script, executor, limits=GRADE):
    out = grade_script(task, script, executor, [0.5, 0.6, 0.7], limits=limits)
    assert out is not None, "the grader itself must not fail on a hostile submission"
    return out


def test_wide_header_submission_is_refused_before_parsing(task, local_executor):  # noqa: F811
    # the original attack: one 2M-field header line in 4 MiB (used to cost ~2.2 GiB RSS)
    script = "open('submission.csv','w').write('c,' * (1 << 21) + '\\n')"
    out = _grade(task, script, local_executor)
    assert out.status == "no_submission" and out.score == 0.2
    assert "line 1 is 4.0 MiB long; the limit is 65536 bytes per line" in out.metrics["invalid_reason"]


def test_header_with_too_many_fields_names_the_expected_columns(task, local_executor):  # noqa: F811
    script = "open('submission.csv','w').write(','.join(f'c{i}' for i in range(5000)) + '\\n1\\n')"
    out = _grade(task, script, local_executor)
    reason = out.metrics["invalid_reason"]
    assert "header has 5000 fields; expected exactly ['id', 'Status']" in reason, reason


def test_oversized_submission_is_never_read_back(task, local_executor):  # noqa: F811
    script = "open('submission.csv','wb').write(b'0' * (17 << 20))"
    out = _grade(task, script, local_executor)
    assert out.status == "no_submission"
    assert out.metrics["invalid_reason"] == "submission.csv is 17825792 bytes; the limit is 16777216 bytes"


def test_oversized_output_reported_by_the_executor(local_executor):  # noqa: F811
    r = local_executor.run(
        "open('big.bin','wb').write(b'x' * 5000)",
        outputs=["big.bin"],
        limits=dataclasses.replace(SMALL, max_read_bytes=4096),
    )
    assert r.status == "ok" and r.files == {} and r.oversized_files == {"big.bin": 5000}


def test_many_lines_and_feedback_flood_are_capped(task, local_executor):  # noqa: F811
    script = "import sys\nsys.stdout.write('A' * 200000)\nopen('submission.csv','w').write('\\n' * 100000)"
    out = _grade(task, script, local_executor)
    assert out.status == "no_submission"
    assert "has 100000 lines; expected a header and" in out.metrics["invalid_reason"]
    assert len(out.feedback) <= FEEDBACK_MAX_CHARS


def test_bad_ids_message_is_capped(task):
    n = len(task.read_answers())
    rows = "".join(f"{'x' * 2000}{i},0.5\n" for i in range(n))
    result = ExecutionResult("ok", 0, "", "", 1.0, 1.0, None, files={"submission.csv": f"id,Status\n{rows}".encode()})
    out = outcome_from_execution(task, result, [0.5])
    reason = out.metrics["invalid_reason"]
    assert reason.startswith(f"submission.csv has {n} rows; expected {n}") and len(reason) <= 1000, reason
    assert reason.endswith("more characters cut]")
    with pytest.raises(SubmissionError, match="has 51 lines; expected a header and 10 rows"):
        read_submission(f"id,Status\n{rows[: 51 * 2000]}".encode(), expected_columns=["id", "Status"], expected_rows=10)


def test_valid_submission_still_scores(task, local_executor):  # noqa: F811
    script = (
        "import pandas as pd\n"
        "t = pd.read_csv('data/test.csv')\n"
        "pd.DataFrame({'id': t['id'], 'Status': 0.5}).to_csv('submission.csv', index=False)\n"
    )
    out = _grade(task, script, local_executor)
    assert out.status == "valid", out.feedback


def test_grader_peak_rss_is_bounded_on_maximal_submissions():
    from benchmarks.grader_bound import measure_payload

    for name in ("wide_header", "string_cells"):
        row = measure_payload(name, "flights_late")  # the largest shipped test set (12,000 rows)
        assert row["status"] == "no_submission"
        sizes = {k: row[k] >> 20 for k in ("baseline_rss", "peak_rss")}  # MiB, readable on failure
        # What grading a maximal submission adds is the bound that matters.
        assert row["peak_rss"] - row["baseline_rss"] <= 64 << 20, (name, sizes)
        # The absolute cap follows the host's imports: pandas >= 3 loads pyarrow when it is
        # installed (the trl extra's `datasets` brings it): ~240 MiB before any grading, 190
        # without; the same child's peak measured 295 MiB alone, 310 MiB early in the suite and 337 MiB
        # once late in the full suite (2026-12-05), so the cap leaves that spread room.
        assert row["peak_rss"] <= 384 << 20, (name, sizes)


# ---------------------------------------------------------------------------- cleanup and quota
@pytest.fixture
def work_base():
    """A world-traversable work base of this test alone (to see exactly what a run leaves)."""
    d = tempfile.mkdtemp(prefix="wmrl-hardening-")
    os.chmod(d, 0o755)
    yield d
    remove_tree(d)


DEEP_TREE = """
import os
for i in range(1500):
    os.mkdir("d")
    os.chdir("d")
open("payload", "wb").write(b"x" * 1000)
os.chmod(".", 0)
"""


def test_deep_tree_cannot_defeat_cleanup(work_base):
    ex = LocalExecutor(TEST_UIDS, work_base=work_base)
    r = ex.run(DEEP_TREE, limits=dataclasses.replace(SMALL, wall_seconds=60, cpu_seconds=30))
    assert r.status == "ok", r.stderr_tail
    assert os.listdir(work_base) == []  # nothing left on the host, no exception escaped


def test_deep_tree_removal_without_tmpfs(work_base):
    # the fallback path (no quota mount): the fd-based flat removal does the work
    ex = LocalExecutor(TEST_UIDS, work_base=work_base, work_quota=False)
    r = ex.run(DEEP_TREE, limits=dataclasses.replace(SMALL, wall_seconds=60, cpu_seconds=30))
    assert r.status == "ok", r.stderr_tail
    assert os.listdir(work_base) == []


def test_work_dir_quota_caps_total_writes(work_base):
    ex = LocalExecutor(TEST_UIDS, work_base=work_base)
    script = (
        "import errno\n"
        "for i in range(64):\n"
        "    try:\n"
        "        open(f'f{i}', 'wb').write(b'x' * (4 << 20))\n"
        "    except OSError as e:\n"
        "        print('stopped', i, errno.errorcode[e.errno]); break\n"
    )
    r = ex.run(script, limits=dataclasses.replace(SMALL, max_work_bytes=16 << 20))
    assert r.status == "ok" and r.stdout_tail.startswith("stopped 4 ENOSPC"), r.stdout_tail
    assert os.listdir(work_base) == []
    crash = ex.run(
        "open('f', 'wb').write(b'x' * (4 << 20))\nopen('g', 'wb').write(b'x' * (4 << 20))",
        limits=dataclasses.replace(SMALL, max_work_bytes=6 << 20),
    )
    assert crash.status == "killed_limit" and "work dir quota of 6291456 bytes exhausted" in crash.reason


# ---------------------------------------------------------------------------- strict, answers
def test_catalog_private_dir_is_root_only_after_load(task):
    mode = (task.private_dir).stat().st_mode
    assert mode & 0o077 == 0, oct(mode)


def test_answers_unreadable_even_with_the_unsafe_opt_out(task, monkeypatch):
    ex = LocalExecutor(TEST_UIDS, bwrap="/nonexistent/bwrap", unsafe_no_isolation=True)
    answers = task.private_dir / "answers.csv"
    r = ex.run(f"print(open({str(answers)!r}).read()[:20])", limits=SMALL)
    assert r.status == "error" and "PermissionError" in r.stderr_tail


def test_only_the_python_runtime_is_mounted(local_executor):  # noqa: F811
    probe = (
        "import os\n"
        "print(sorted(os.listdir('/usr')), os.path.exists('/usr/bin/sh'), os.path.exists('/usr/share/doc'),"
        " os.path.exists('/usr/sbin'))"
    )
    r = local_executor.run(probe, limits=SMALL)
    assert r.status == "ok", r.stderr_tail
    # the pinned runtime venv's sys.path holds no /usr/local (Debian's python3 had dist-packages there)
    assert r.stdout_tail.strip() == "['bin', 'lib', 'lib64', 'share'] False False False"


def test_hidden_paths_under_a_visible_mount_are_masked():
    # outside /tmp (the sandbox has its own /tmp): like a system-wide install under /usr
    root = Path(tempfile.mkdtemp(prefix="wmrl-hardening-", dir="/var/tmp"))
    try:
        private = root / "pkg" / "private"
        private.mkdir(parents=True)
        (private / "answers.csv").write_text("id,y\n0,SECRET\n")
        for d in (root, root / "pkg", private):
            os.chmod(d, 0o755)
        os.chmod(private / "answers.csv", 0o644)
        visible = LocalExecutor(TEST_UIDS, ro_paths=[str(root / "pkg")])
        probe = f"import os\nprint(os.listdir({str(private)!r}))"
        assert "answers.csv" in visible.run(probe, limits=SMALL).stdout_tail  # the control: visible unmasked
        masked = LocalExecutor(TEST_UIDS, ro_paths=[str(root / "pkg")], hidden_paths=[str(private)])
        r = masked.run(probe, limits=SMALL)
        assert r.status == "ok" and r.stdout_tail.strip() == "[]", (r.stdout_tail, r.stderr_tail)
    finally:
        remove_tree(root)


# ---------------------------------------------------------------------------- cgroup limits
needs_cgroups = pytest.mark.skipif(not cgroup_available(), reason="cgroups not writable here")

SHARED_MAPPING = """
import mmap
m = mmap.mmap(-1, 768 << 20, flags=mmap.MAP_SHARED)
for i in range(0, len(m), 4096):
    m[i] = 1
print("held 768 MiB of shared memory")
"""


@needs_cgroups
def test_shared_memory_is_capped(local_executor):  # noqa: F811
    r = local_executor.run(SHARED_MAPPING, limits=dataclasses.replace(SMALL, wall_seconds=30, cpu_seconds=20))
    assert r.status == "killed_memory", (r.status, r.stdout_tail, r.reason)
    assert "held" not in r.stdout_tail
    assert r.peak_rss_bytes is not None and r.peak_rss_bytes <= SMALL.memory_bytes + (64 << 20)


MEMFD = """
import mmap, os
fd = os.memfd_create("hog")
os.ftruncate(fd, 768 << 20)
m = mmap.mmap(fd, 768 << 20)
for i in range(0, len(m), 4096):
    m[i] = 1
print("held 768 MiB of memfd")
"""


@needs_cgroups
def test_memfd_is_capped(local_executor):  # noqa: F811
    r = local_executor.run(MEMFD, limits=dataclasses.replace(SMALL, wall_seconds=30, cpu_seconds=20))
    assert r.status in ("killed_memory", "killed_limit"), (r.status, r.stdout_tail, r.reason)
    assert "held" not in r.stdout_tail


UNWAITED_SPINNERS = """
import os, time
for _ in range(6):
    if os.fork() == 0:
        t = time.process_time()
        while time.process_time() - t < 1.5:
            pass
        os._exit(0)
time.sleep(8)   # never waits: the children's CPU never reaches this process's rusage
print("done")
"""


@needs_cgroups
def test_cpu_of_unwaited_children_counts(local_executor):  # noqa: F811
    r = local_executor.run(UNWAITED_SPINNERS, limits=dataclasses.replace(SMALL, wall_seconds=30, cpu_seconds=2))
    assert r.status == "timeout" and "all processes of the run together" in r.reason, (r.status, r.reason)
    assert "done" not in r.stdout_tail


NESTED_USERNS = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
rc = libc.unshare(0x10000000)  # CLONE_NEWUSER
print("unshare", rc, os.strerror(ctypes.get_errno()) if rc else "ALLOWED")
"""


def test_nested_user_namespaces_are_refused(local_executor):  # noqa: F811
    r = local_executor.run(NESTED_USERNS, limits=SMALL)
    assert r.status == "ok" and r.stdout_tail.startswith("unshare -1"), r.stdout_tail


# ---------------------------------------------------------------------------- a grader that dies
DIE_CHILD = """
import sys, time
from wmrl_envs.sandbox import LocalExecutor, Limits
from wmrl_envs.sandbox.local import LocalConfig
ex = LocalExecutor(LocalConfig(uid_base=int(sys.argv[1]), uid_count=2), work_base=sys.argv[2])
print("ready", flush=True)
ex.run("import time\\nprint('started', flush=True)\\ntime.sleep(120)", limits=Limits(wall_seconds=120, cpu_seconds=120))
"""


def _uid_processes(uids) -> list[int]:
    return sorted(pid for pids in uid_processes(uids).values() for pid in pids)


def test_sigkill_of_the_grader_leaves_nothing_running(work_base):
    uid_base = TEST_UIDS.uid_base + TEST_UIDS.uid_count + 4  # a range no other test uses
    uids = range(uid_base, uid_base + 2)
    proc = subprocess.Popen(
        [sys.executable, "-c", DIE_CHILD, str(uid_base), work_base], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 30
        while not _uid_processes(uids) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        assert _uid_processes(uids), "the sandbox never started"
        assert os.listdir(work_base), "the run has a work dir"
        proc.kill()  # SIGKILL: no finally, no cleanup in the grader
        proc.wait()
        deadline = time.monotonic() + 5
        while _uid_processes(uids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _uid_processes(uids) == [], "the sandbox outlived its grader"
    finally:
        if proc.poll() is None:
            proc.kill()
    # the next executor on this work base removes what the dead grader left (work dir + cgroup)
    LocalExecutor(TEST_UIDS, work_base=work_base)
    assert os.listdir(work_base) == []
    assert not [g for g in _run_groups() if g.startswith(f"{proc.pid}-")]


def _run_groups() -> list[str]:
    from wmrl_envs.sandbox.cgroup import _group_bases

    names: list[str] = []
    for base in _group_bases().values():
        if base.is_dir():
            names += [d.name for d in base.iterdir() if d.is_dir()]
    return names


def test_launcher_enforces_the_wall_limit_itself():
    t0 = time.monotonic()
    proc = subprocess.run(
        ["/usr/bin/python3", "-S", "-I", "-c", LAUNCHER_SOURCE, '{"wall_seconds": 1}', "/bin/sleep", "30"],
        timeout=20,
    )
    assert proc.returncode == 128 + 9 and time.monotonic() - t0 < 5


# ---------------------------------------------------------------------------- bring your own table
@pytest.fixture
def table(tmp_path):
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    n = 300
    df = pd.DataFrame(
        {
            "rating": rng.integers(1, 6, n),  # 5 distinct numbers: inferred as classes without a hint
            "x": rng.normal(size=n),
            "customer": [f"c{i:05d}" for i in range(n)],
            "answer": rng.choice(["yes", "no"], n, p=[0.3, 0.7]),
        }
    )
    df["answer_code"] = df["answer"].map({"yes": "Y", "no": "N"})
    path = tmp_path / "t.csv"
    df.to_csv(path, index=False)
    return path


def test_byo_regression_metric_implies_the_type(table, tmp_path):
    from wmrl_envs.autoresearch.byo import task_from_csv

    t = task_from_csv(table, "rating", metric="rmse", root=tmp_path, task_id="r")
    assert t.task_type == "regression"


def test_byo_contradiction_names_task_type(table, tmp_path):
    from wmrl_envs.autoresearch.cli import main

    rc = main(["byo", str(table), "--target", "rating", "--metric", "rmse", "--task-type", "multiclass",
               "--root", str(tmp_path)])  # fmt: skip
    assert rc == 2


def test_byo_contradiction_message(table, tmp_path):
    from wmrl_envs.autoresearch.byo import ByoError, task_from_csv

    with pytest.raises(ByoError, match=r"metric 'rmse' does not fit a multiclass task \(--task-type"):
        task_from_csv(table, "rating", metric="rmse", task_type="multiclass", root=tmp_path)


def test_byo_positive_class_is_chosen_and_printed(table, tmp_path, capsys):
    from wmrl_envs.autoresearch.cli import main

    assert main(["byo", str(table), "--target", "answer", "--positive-class", "yes", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "positive class: 'yes' (as asked); submissions give P(answer = yes)" in out
    assert "column 'customer' looks like a row id" in out
    assert "column 'answer_code' determines the target 'answer' on its own" in out
    assert main(["byo", str(table), "--target", "answer", "--positive-class", "maybe", "--root", str(tmp_path)]) == 2


def test_byo_default_positive_class_is_reported(table, tmp_path):
    from wmrl_envs.autoresearch.byo import byo_notes, task_from_csv

    t = task_from_csv(table, "answer", root=tmp_path, task_id="d")
    note = "positive class: 'yes' (the conventional positive label 'yes'; --positive-class to change)"
    assert t.positive_class == "yes" and any(note in n for n in byo_notes(t))


def test_byo_large_table_is_sampled_with_a_note(table, tmp_path):
    from wmrl_envs.autoresearch.byo import byo_notes, task_from_csv

    t = task_from_csv(table, "answer", root=tmp_path, task_id="s", max_rows=100)
    assert t.stats["n_train"] + t.stats["n_test"] == 100
    assert any("has 300 rows; a seeded sample of 100" in n for n in byo_notes(t))
