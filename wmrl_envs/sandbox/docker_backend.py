"""Docker sandbox backend: one throwaway container per run, through the ``docker`` SDK.

Each run gets a fresh container of the offline-built image (see
:mod:`wmrl_envs.sandbox.image`): ``network_mode="none"``, a cgroup memory cap without
swap, a pids cap, a CPU quota, a read-only root with a size-capped ``/tmp`` tmpfs, a
non-root user, every capability dropped, ``no-new-privileges``, and ``ulimit`` s for CPU
time, file size and data size (so a memory bomb fails with ``MemoryError`` as it does
locally; the cgroup cap backs it up across processes). The work dir is bind-mounted
read-write at ``/sandbox``; inputs inside it are root-owned read-only copies. Output
streams through an attach socket with a byte cap; the container's log driver is off so
a flood never reaches the engine's disk.

CPU seconds and peak memory come from the container's cgroup (``cpuacct`` /
``memory.max_usage_in_bytes`` on cgroup v1, ``cpu.stat`` / ``memory.peak`` on v2), read
after the container exits and before it is removed; ``None`` when the engine's cgroups
are not visible from here (e.g. a remote engine).

Classes: :class:`DockerExecutor`, :class:`DockerConfig`.
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from wmrl_envs.sandbox.base import (
    DEFAULT_ENV,
    SANDBOX_DIR,
    ExecutionResult,
    Limits,
    OutputTail,
    SandboxUnavailable,
    WorkDir,
    classify_exit,
)
from wmrl_envs.sandbox.image import docker_client, image_exists, image_tag

__all__ = ["DockerExecutor", "DockerConfig"]

_CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class DockerConfig:
    """Settings of :class:`DockerExecutor`.

    Attributes:
        image: sandbox image (``None``: :func:`~wmrl_envs.sandbox.image.image_tag`, the one
            ``build-image`` makes).
        python: interpreter inside the image.
        user: ``uid:gid`` the script runs as (default: ``nobody``).
        cpus: CPU quota of one container (cores).
        env: the script's whole environment.
        work_base: host directory for work dirs (``None``: the system temp dir); must be
            visible to the engine at the same path (true for a local engine).
    """

    image: str | None = None
    python: str = "/usr/bin/python3"
    user: str = "65534:65534"
    cpus: float = 1.0
    env: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_ENV))
    work_base: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.cpus, (int, float)) or not self.cpus > 0:
            raise ValueError(f"DockerConfig.cpus must be a positive number of cores, got {self.cpus!r}")
        uid, sep, gid = self.user.partition(":")
        if not (uid.isdigit() and sep and gid.isdigit()) or int(uid) == 0:
            raise ValueError(f"DockerConfig.user must be a non-root numeric 'uid:gid', got {self.user!r}")


class DockerExecutor:
    """Run untrusted scripts in locked-down, network-less Docker containers.

    Args:
        config: settings (defaults: :class:`DockerConfig`).
        client: a ``docker.DockerClient`` (default: ``docker.from_env()``).
        **overrides: fields of :class:`DockerConfig`.

    Raises :class:`~wmrl_envs.sandbox.base.SandboxUnavailable` when no engine is reachable
    or the image is missing (the message gives the command that builds it).

    >>> ex = DockerExecutor()                                            # doctest: +SKIP
    >>> ex.run("import sklearn; print(sklearn.__version__)").stdout_tail  # doctest: +SKIP
    '1.2.1\\n'
    """

    backend = "docker"

    def __init__(self, config: DockerConfig | None = None, *, client=None, **overrides):
        self.config = config or DockerConfig()
        if overrides:
            self.config = DockerConfig(**{**self.config.__dict__, **overrides})
        self.image = self.config.image or image_tag()
        self.client = docker_client(client)
        if not image_exists(self.image, self.client):
            raise SandboxUnavailable(
                f"Docker sandbox image {self.image!r} is missing. Build it once (offline, ~3-5 min, root):\n"
                f"    python -m wmrl_envs.sandbox.cli build-image" +
                ("" if self.config.image is None else f" --tag {self.image}"))
        self._uid, self._gid = (int(x) for x in self.config.user.split(":"))

    def run(self, script: str, *, inputs: Mapping[str, str | os.PathLike] | None = None,
            outputs: Sequence[str] = (), limits: Limits | None = None) -> ExecutionResult:
        """Run ``script`` as ``python3 main.py``; see :class:`~wmrl_envs.sandbox.base.Executor`."""
        limits = limits or Limits()
        if not isinstance(limits, Limits):
            raise TypeError(f"limits must be a Limits, got {type(limits).__name__}")
        root = os.geteuid() == 0
        work = WorkDir(script, inputs, outputs, owner=(self._uid, self._gid) if root else None,
                       base_dir=self.config.work_base)
        try:
            if not root:  # cannot chown: let the container's uid write anyway
                os.chmod(work.path, 0o777)
            result = self._run_container(work, limits)
            files = work.read_outputs(limits.max_file_bytes)
        finally:
            work.cleanup()
        return ExecutionResult(**{**result, "files": files})

    def _create(self, work: WorkDir, limits: Limits):
        from docker.types import LogConfig, Ulimit

        cpu = math.ceil(limits.cpu_seconds)
        return self.client.containers.create(
            self.image, [self.config.python, "main.py"], working_dir=SANDBOX_DIR, user=self.config.user,
            environment=dict(self.config.env), hostname="sandbox", network_mode="none",
            mem_limit=limits.memory_bytes, memswap_limit=limits.memory_bytes, pids_limit=limits.max_processes,
            nano_cpus=int(self.config.cpus * 1e9), read_only=True,
            tmpfs={"/tmp": f"size={limits.max_file_bytes},mode=1777"},
            cap_drop=["ALL"], security_opt=["no-new-privileges"],
            ulimits=[Ulimit(name="cpu", soft=cpu, hard=cpu), Ulimit(name="data", soft=limits.memory_bytes, hard=limits.memory_bytes),
                     Ulimit(name="fsize", soft=limits.max_file_bytes, hard=limits.max_file_bytes),
                     Ulimit(name="core", soft=0, hard=0)],
            volumes={str(work.path): {"bind": SANDBOX_DIR, "mode": "rw"}},
            log_config=LogConfig(type="none"), labels={"org.wmrl.sandbox": "run"}, detach=True)

    def _run_container(self, work: WorkDir, limits: Limits) -> dict:
        import requests.exceptions

        container = self._create(work, limits)
        try:
            out, err = OutputTail(limits.tail_bytes), OutputTail(limits.tail_bytes)
            killed: list[tuple[str, str]] = []
            stream = container.attach(stdout=True, stderr=True, stream=True, logs=False, demux=True)

            def pump() -> None:
                for chunk_out, chunk_err in stream:
                    out.add(chunk_out or b"")
                    err.add(chunk_err or b"")
                    if out.total + err.total > limits.max_output_bytes and not killed:
                        killed.append(("killed_limit", f"output limit of {limits.max_output_bytes} bytes exceeded"))
                        _kill(container)
                        return

            reader = threading.Thread(target=pump, name="wmrl-docker-output", daemon=True)
            reader.start()
            start = time.monotonic()
            container.start()
            try:
                exit_code = container.wait(timeout=limits.wall_seconds)["StatusCode"]
            except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
                if not killed:
                    killed.append(("timeout", f"wall time limit of {limits.wall_seconds:g} s exceeded"))
                _kill(container)
                exit_code = container.wait()["StatusCode"]
            wall = time.monotonic() - start
            reader.join(timeout=5)
            stream.close()
            container.reload()
            oom = container.attrs["State"].get("OOMKilled", False)
            cpu, peak = _cgroup_usage(container.id)
        finally:
            container.remove(force=True)
        returncode = -(exit_code - 128) if 128 < exit_code < 128 + 65 else exit_code
        if killed:
            status, reason = killed[0]
        elif oom:
            status, reason = "killed_memory", f"memory limit of {limits.memory_bytes} bytes exceeded (OOM-killed)"
        else:
            status, reason = classify_exit(returncode, err.text(), cpu, limits)
        return dict(status=status, returncode=returncode, stdout_tail=out.text(), stderr_tail=err.text(),
                    wall_seconds=wall, cpu_seconds=cpu, peak_rss_bytes=peak, backend=self.backend, reason=reason)


def _kill(container) -> None:
    import docker.errors

    try:
        container.kill()
    except docker.errors.APIError:
        pass  # already exited


def _cgroup_usage(container_id: str) -> tuple[float | None, int | None]:
    """(CPU seconds, peak memory bytes) of a stopped container's cgroup, ``None`` where unreadable."""
    def read(*candidates: Path) -> str | None:
        for path in candidates:
            try:
                return path.read_text()
            except OSError:
                continue
        return None

    v1 = [_CGROUP_ROOT / c / "docker" / container_id for c in ("cpuacct", "memory")]
    v2 = [_CGROUP_ROOT / "system.slice" / f"docker-{container_id}.scope", _CGROUP_ROOT / "docker" / container_id]
    cpu_ns = read(v1[0] / "cpuacct.usage")
    cpu = int(cpu_ns) / 1e9 if cpu_ns else None
    if cpu is None:
        stat = read(*(d / "cpu.stat" for d in v2))
        usage = dict(line.split() for line in stat.splitlines()).get("usage_usec") if stat else None
        cpu = int(usage) / 1e6 if usage else None
    peak = read(v1[1] / "memory.max_usage_in_bytes", *(d / "memory.peak" for d in v2))
    return cpu, (int(peak) if peak else None)
