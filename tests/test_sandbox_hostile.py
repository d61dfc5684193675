"""The sandbox contract against the real backends (local bwrap and Docker), incl. hostile scripts.

Every test runs once per backend. Each hostile script must end with a clean status and
leave the host unaffected (checked on the host side, not just from the script's output).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import os
import time

from sandbox_helpers import (  # noqa: F401
    HIDDEN_PROBE,
    SMALL,
    _docker_executor,
    executor,
    local_executor,
    public_tmp,
    sandbox_containers,
    sandbox_processes,
    tcp_server,
    write_hidden_labels,
)

from wmrl_envs.sandbox import ExecutorPool, Job

PR_SET_CHILD_SUBREAPER = 36  # prctl(2)

TRAIN_SCRIPT = """
import pandas as pd
from sklearn.linear_model import LogisticRegression
train = pd.read_csv("data/train.csv")
test = pd.read_csv("data/test.csv")
model = LogisticRegression().fit(train[["x1", "x2"]], train["y"])
pd.DataFrame({"id": test["id"], "y": model.predict(test[["x1", "x2"]])}).to_csv("submission.csv", index=False)
print("trained on", len(train), "rows")
"""


def _host_is_clean(executor) -> None:
    if executor.backend == "docker":
        assert sandbox_containers(executor) == []
    else:
        assert sandbox_processes() == []


def test_training_script_produces_submission(executor, tmp_path):
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 2))
    pd.DataFrame({"x1": x[:, 0], "x2": x[:, 1], "y": (x[:, 0] + x[:, 1] > 0).astype(int)}).to_csv(
        tmp_path / "train.csv", index=False
    )
    xt = rng.normal(size=(50, 2))
    pd.DataFrame({"id": range(50), "x1": xt[:, 0], "x2": xt[:, 1]}).to_csv(tmp_path / "test.csv", index=False)
    truth = (xt[:, 0] + xt[:, 1] > 0).astype(int)

    limits = dataclasses.replace(SMALL, wall_seconds=60, cpu_seconds=30, memory_bytes=1 << 30)
    r = executor.run(
        TRAIN_SCRIPT,
        inputs={"data/train.csv": tmp_path / "train.csv", "data/test.csv": tmp_path / "test.csv"},
        outputs=["submission.csv", "never_written.csv"],
        limits=limits,
    )
    assert r.status == "ok", (r.reason, r.stderr_tail)
    assert r.returncode == 0 and "trained on 200 rows" in r.stdout_tail
    assert set(r.files) == {"submission.csv"}
    sub = pd.read_csv(__import__("io").BytesIO(r.files["submission.csv"]))
    assert list(sub["id"]) == list(range(50))
    assert (sub["y"].to_numpy() == truth).mean() > 0.9
    assert r.cpu_seconds is not None and r.cpu_seconds > 0.1  # importing sklearn is real work
    assert r.peak_rss_bytes is not None and 30 << 20 < r.peak_rss_bytes < 1 << 30
    assert r.backend == executor.backend


def test_exception_is_error_with_traceback(executor):
    r = executor.run("def f():\n    raise ValueError('boom 42')\nf()\n", limits=SMALL)
    assert r.status == "error" and r.returncode == 1
    assert "Traceback (most recent call last)" in r.stderr_tail
    assert r.stderr_tail.rstrip().endswith("ValueError: boom 42")


def test_inputs_are_read_only_and_host_copy_untouched(executor, tmp_path):
    src = tmp_path / "train.csv"
    src.write_text("a,b\n1,2\n")
    script = (
        "print(open('data/train.csv').read(), end='')\n"
        "try:\n    open('data/train.csv', 'w').write('tampered')\nexcept OSError as e:\n    print('WRITE FAILED', type(e).__name__)\n"
    )
    r = executor.run(script, inputs={"data/train.csv": src}, limits=SMALL)
    assert r.status == "ok", r.stderr_tail
    assert r.stdout_tail == "a,b\n1,2\nWRITE FAILED PermissionError\n"
    assert src.read_text() == "a,b\n1,2\n"


def test_infinite_loop_hits_cpu_limit(executor):
    r = executor.run("while True:\n    pass\n", limits=dataclasses.replace(SMALL, wall_seconds=20, cpu_seconds=1))
    assert r.status == "timeout", (r.reason, r.stderr_tail)
    assert "CPU" in r.reason
    assert r.wall_seconds < 15
    _host_is_clean(executor)


def test_sleeping_forever_hits_wall_limit(executor):
    r = executor.run("import time\ntime.sleep(3600)\n", limits=dataclasses.replace(SMALL, wall_seconds=1.5))
    assert r.status == "timeout" and "wall" in r.reason
    assert 1.5 <= r.wall_seconds < 10
    _host_is_clean(executor)


def test_memory_bomb_is_killed_memory(executor):
    script = "hog = []\nwhile True:\n    hog.append(bytearray(16 << 20))\n"
    r = executor.run(script, limits=SMALL)
    assert r.status == "killed_memory", (r.reason, r.stderr_tail)
    assert r.peak_rss_bytes is None or r.peak_rss_bytes <= SMALL.memory_bytes + (32 << 20)
    assert executor.run("print('alive')", limits=SMALL).stdout_tail == "alive\n"


def test_fork_bomb_is_contained(executor):
    # Every process forks forever; forks start failing at the process cap.
    r = executor.run("import os\nwhile True:\n    os.fork()\n", limits=SMALL)
    assert r.status == "killed_limit", (r.reason, r.stderr_tail)
    assert "process limit" in r.reason
    _host_is_clean(executor)
    assert executor.run("print('alive')", limits=SMALL).status == "ok"


def test_fork_bomb_that_swallows_errors_times_out(executor):
    r = executor.run(
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        limits=dataclasses.replace(SMALL, wall_seconds=2),
    )
    assert r.status in ("timeout", "killed_limit"), (r.reason, r.stderr_tail)
    _host_is_clean(executor)


def test_a_killed_run_leaves_no_zombie_on_its_uid_when_its_orphans_reach_the_host(local_executor):
    # A timeout's SIGKILL can take bwrap's monitor before its pid-1 child, which is then
    # orphaned. This process stands in for the host's init (the subreaper orphans would
    # reach) and never reaps them: the uid is clean only if the launcher reaps its own.
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    try:
        r = local_executor.run(
            "import os\nos.fork()\nwhile True:\n    pass\n", limits=dataclasses.replace(SMALL, wall_seconds=1)
        )
        left = sandbox_processes()
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        for pid in sandbox_processes():  # what reached us: reap it, so no later test sees it
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
    assert r.status == "timeout", (r.reason, r.stderr_tail)
    assert left == []


def test_gigabyte_of_stdout_is_cut(executor):
    script = "import sys\nblock = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(block)\n"
    t0 = time.monotonic()
    r = executor.run(script, limits=SMALL)
    assert r.status == "killed_limit" and "output limit" in r.reason
    assert time.monotonic() - t0 < 10  # cut at 1 MiB, not after writing 1 GiB
    assert 0 < len(r.stdout_tail) <= SMALL.tail_bytes and set(r.stdout_tail) == {"x"}
    _host_is_clean(executor)


def test_file_size_limit(executor):
    r = executor.run("open('big.bin', 'wb').write(b'x' * (64 << 20))\n", limits=SMALL)
    assert r.status == "killed_limit" and "file size" in r.reason, (r.reason, r.stderr_tail)


def test_writing_outside_work_dir_fails_and_host_unaffected(executor, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    targets = [
        str(outside / "planted.txt"),
        "/etc/wmrl-planted",
        "/usr/wmrl-planted",
        "/wmrl-planted",
        "/sandbox/../wmrl-planted",
    ]
    script = f"""
import json
report = {{}}
for path in {targets!r}:
    try:
        with open(path, "w") as f:
            f.write("pwned")
        report[path] = "written"
    except OSError as e:
        report[path] = type(e).__name__
open("inside.txt", "w").write("fine")
print(json.dumps(report))
"""
    r = executor.run(script, outputs=["inside.txt"], limits=SMALL)
    assert r.status == "ok", r.stderr_tail
    report = json.loads(r.stdout_tail)
    assert all(v != "written" for v in report.values()), report
    assert r.files == {"inside.txt": b"fine"}
    for path in targets:
        assert not os.path.exists(path), path
    assert list(outside.iterdir()) == []


def test_hidden_path_is_not_readable(executor, public_tmp):
    labels = write_hidden_labels(public_tmp)
    r = executor.run(HIDDEN_PROBE.format(labels=str(labels)), limits=SMALL)
    assert r.status == "ok", r.stderr_tail
    assert "SECRET-LABEL-7f3a" not in r.stdout_tail
    assert "LISTED" not in r.stdout_tail, r.stdout_tail
    assert r.stdout_tail.count("DENIED") == 4


def test_tcp_to_host_loopback_fails(executor, tcp_server):
    port, accepted = tcp_server
    script = f"""
import socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2).close()
    print("CONNECTED")
except OSError as e:
    print("FAILED", type(e).__name__)
    raise
"""
    r = executor.run(script, limits=SMALL)
    assert r.status == "error"
    assert "CONNECTED" not in r.stdout_tail and r.stdout_tail.startswith("FAILED")
    time.sleep(0.3)  # let the server thread record a connection, had one happened
    assert accepted == []


def test_planted_symlink_output_is_not_followed(executor):
    r = executor.run(
        "import os\nos.symlink('/etc/hostname', 'submission.csv')\nos.mkfifo('pipe.csv')\n",
        outputs=["submission.csv", "pipe.csv"],
        # not a timing test: a container start on a loaded 2-core host once took over 4 s
        limits=dataclasses.replace(SMALL, wall_seconds=30),
    )
    assert r.status == "ok", r.stderr_tail
    assert r.files == {}


def test_process_cap_is_exact(executor):
    # The script itself counts: with max_processes=4 it can have 3 children, not 4.
    script = """
import os, time
kids = []
for i in range(4):
    try:
        pid = os.fork()
    except BlockingIOError:
        print("fork", i, "refused")
        break
    if pid == 0:
        time.sleep(5)
        os._exit(0)
    kids.append(pid)
print("children", len(kids))
"""
    r = executor.run(script, limits=dataclasses.replace(SMALL, max_processes=4, wall_seconds=10))
    assert r.status == "ok", (r.reason, r.stderr_tail)
    assert r.stdout_tail == "fork 3 refused\nchildren 3\n"
    _host_is_clean(executor)  # the sleeping children died with the script


def test_runs_unprivileged(executor):
    script = """
import os
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
print(os.getuid(), os.geteuid(), status["CapEff"].strip(), status["CapPrm"].strip(), status["NoNewPrivs"].strip())
"""
    r = executor.run(script, limits=SMALL)
    uid, euid, cap_eff, cap_prm, no_new_privs = r.stdout_tail.split()
    assert int(uid) != 0 and int(euid) != 0
    assert int(cap_eff, 16) == 0 and int(cap_prm, 16) == 0
    assert no_new_privs == "1"


def test_pool_runs_a_batch(executor):
    # A functional test, not a limits test: a roomy wall limit keeps a loaded host's slow
    # container starts from turning into timeouts.
    roomy = dataclasses.replace(SMALL, wall_seconds=60)
    jobs = [Job(f"print({i} * {i})", limits=roomy) for i in range(3)] + [Job("raise SystemExit(2)", limits=roomy)]
    with ExecutorPool(executor, max_concurrent=2) as pool:
        results = pool.map(jobs)
    assert [r.status for r in results] == ["ok", "ok", "ok", "error"]
    assert [r.stdout_tail for r in results[:3]] == ["0\n", "1\n", "4\n"]
    assert results[3].returncode == 2
    _host_is_clean(executor)
