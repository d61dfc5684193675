"""Shared fixtures and helpers of the sandbox tests (imported by tests/test_sandbox*.py).

Fixtures: ``executor`` (parametrised over the ``local`` and ``docker`` backends; Docker is
skipped only when no engine is reachable), ``local_executor``, ``tcp_server``, ``public_tmp``.
Helpers: :data:`SMALL`, :data:`TEST_UIDS`, :data:`HIDDEN_PROBE`, :func:`write_hidden_labels`, :func:`sandbox_processes`, :func:`sandbox_containers`.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
from pathlib import Path

import pytest

from wmrl_envs.sandbox import DockerExecutor, Limits, LocalExecutor, SandboxUnavailable
from wmrl_envs.sandbox.image import docker_client
from wmrl_envs.sandbox.local import LocalConfig
from wmrl_envs.sandbox.uids import uid_processes

#: Small limits so hostile scripts are cut quickly (the test budget is ~3 min on 2 cores).
SMALL = Limits(
    wall_seconds=4,
    cpu_seconds=2,
    memory_bytes=256 << 20,
    max_processes=16,
    max_file_bytes=8 << 20,
    max_output_bytes=1 << 20,
    tail_bytes=4096,
)


#: A uid range of this test process alone, so host checks see no other process's sandboxes.
TEST_UIDS = LocalConfig(uid_base=1_000_000 + (os.getpid() % 50_000) * 16, uid_count=16)


@pytest.fixture(scope="session")
def local_executor() -> LocalExecutor:
    ex = LocalExecutor(TEST_UIDS, strict=True)  # must exercise the real sandbox, not the fallback
    assert ex.sandboxed
    return ex


@pytest.fixture(scope="session")
def _docker_executor() -> DockerExecutor:
    try:
        docker_client()
    except SandboxUnavailable as e:
        pytest.skip(f"no Docker engine reachable, Docker backend not tested: {e}")
    return DockerExecutor()  # a missing image is a failure: scripts/test.sh builds it


@pytest.fixture(params=["local", "docker"])
def executor(request):
    """Each backend in turn."""
    if request.param == "docker":
        return request.getfixturevalue("_docker_executor")
    return request.getfixturevalue("local_executor")


@pytest.fixture
def public_tmp():
    """A fresh world-readable directory under the system temp dir (pytest's own are 0700)."""
    d = Path(tempfile.mkdtemp(prefix="wmrl-sandbox-test-"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def tcp_server():
    """A TCP server on 127.0.0.1 that records accepted connections: yields (port, accepted list)."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    accepted: list[tuple] = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, addr = srv.accept()
            except OSError:
                continue
            accepted.append(addr)
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1], accepted
    finally:
        stop.set()
        t.join(timeout=2)
        srv.close()


HIDDEN_PROBE = """
import os
for path in [{labels!r}, "/root", "/work", "/proc/1/root{labels}"]:
    try:
        if os.path.isdir(path):
            print(path, "LISTED", os.listdir(path))
        else:
            print(path, "READ", open(path).read())
    except OSError as e:
        print(path, "DENIED", type(e).__name__)
"""


def write_hidden_labels(public_tmp):
    # World-readable on the host, in a world-traversable dir: only the sandbox's mount
    # namespace can hide it (the unsandboxed fallback reads it, see test_sandbox.py).
    private = public_tmp / "private"
    private.mkdir(mode=0o755)
    labels = private / "hidden_labels.csv"
    labels.write_text("id,label\n0,SECRET-LABEL-7f3a\n")
    os.chmod(labels, 0o644)
    return labels


def sandbox_processes() -> list[int]:
    """Host pids running as one of the test executor's sandbox uids (non-dumpable launchers included)."""
    uids = range(TEST_UIDS.uid_base, TEST_UIDS.uid_base + TEST_UIDS.uid_count)
    return sorted(pid for pids in uid_processes(uids).values() for pid in pids)


def sandbox_containers(executor) -> list:
    """Containers (any state) the Docker backend created and did not remove."""
    return executor.client.containers.list(
        all=True, filters={"label": f"org.wmrl.sandbox.executor={executor.instance_id}"}
    )
