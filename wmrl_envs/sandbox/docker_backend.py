"""Docker sandbox backend: one throwaway container per run, through the ``docker`` SDK.

Each run gets a fresh container of the offline-built image (see
:mod:`wmrl_envs.sandbox.image`): ``network_mode="none"``, a cgroup memory cap without
swap, a pids cap, a CPU quota, a read-only root with a size-capped ``/tmp`` tmpfs, a
non-root uid of its own per run, every capability dropped, ``no-new-privileges``, and ``ulimit`` s for CPU
time, file size and data size (so a memory bomb fails with ``MemoryError`` as it does
locally; the cgroup cap backs it up across processes). The work dir is bind-mounted
read-write at ``/sandbox``; inputs inside it are root-owned read-only copies. Output
streams through an attach socket with a byte cap; the container's log driver is off so
a flood never reaches the engine's disk.

The container's pid 1 is the same launcher as the local backend's
(:mod:`wmrl_envs.sandbox._launcher`): when the script exits it kills every leftover process
(as the local pid namespace does) and keeps the container -- hence its cgroup -- alive
until the host has read the counters: CPU seconds and peak memory (including page cache)
from ``cpuacct.usage`` / ``memory.max_usage_in_bytes`` (cgroup v1) or ``cpu.stat`` /
``memory.peak`` (v2). They are ``None`` when the engine's cgroups are not visible from
here (e.g. a remote engine); the run is otherwise the same.

Classes: :class:`DockerExecutor`, :class:`DockerConfig`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from wmrl_envs.sandbox import workfs
from wmrl_envs.sandbox.base import (
    DEFAULT_ENV,
    SANDBOX_DIR,
    ExecutionResult,
    Limits,
    OutputTail,
    SandboxUnavailable,
    WorkDir,
    classify_exit,
    resolve_limits,
)
from wmrl_envs.sandbox.image import docker_client, image_exists, image_tag
from wmrl_envs.sandbox.local import LAUNCHER_SOURCE, LAUNCHER_WALL_GRACE
from wmrl_envs.sandbox.runtime import RUNTIME_DIR
from wmrl_envs.sandbox.uids import DEFAULT_UID_BASE, UidPool

__all__ = ["DockerExecutor", "DockerConfig", "sweep_containers"]

log = logging.getLogger(__name__)

_CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class DockerConfig:
    """Settings of :class:`DockerExecutor`.

    Attributes:
        image: sandbox image (``None``: :func:`~wmrl_envs.sandbox.image.image_tag`, the one
            ``build-image`` makes).
        python: interpreter inside the image (default: the pinned solutions' runtime the
            image carries, see :mod:`wmrl_envs.sandbox.runtime`).
        user: ``uid:gid`` every script runs as; ``None`` (default): a uid of its own per
            run, from the range ``uid_base`` .. ``uid_base + uid_count`` (see
            :mod:`wmrl_envs.sandbox.uids`), so concurrent runs share no per-user kernel
            limit (processes, inotify instances, ...) and no run can signal another's processes.
        uid_base: first uid of the per-run range (shared with the local backend's default:
            the lock files keep runs of both backends apart).
        uid_count: size of that range = the most runs at once on this host.
        lock_dir: where the per-uid lock files live (``None``: the local backend's
            ``/run/wmrl-sandbox`` as root, else a directory of the caller's own under the
            system temp dir).
        cpus: CPU quota of one container (cores).
        env: the script's whole environment.
        work_base: host directory for work dirs (``None``: the system temp dir); must be
            visible to the engine at the same path (true for a local engine).
    """

    image: str | None = None
    python: str = str(RUNTIME_DIR / "bin" / "python")
    user: str | None = None
    uid_base: int = DEFAULT_UID_BASE
    uid_count: int = 64
    lock_dir: str | None = None
    cpus: float = 1.0
    env: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_ENV))
    work_base: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.cpus, (int, float)) or not self.cpus > 0:
            raise ValueError(f"DockerConfig.cpus must be a positive number of cores, got {self.cpus!r}")
        if self.user is None:
            return
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

    Usage (needs a Docker engine and the sandbox image, so not run as a doctest)::

        ex = DockerExecutor()
        ex.run("import sklearn; print(sklearn.__version__)").stdout_tail  # '1.2.1\\n'
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
                f"Docker sandbox image {self.image!r} is missing. Build it once (offline, a few minutes, as root):\n"
                f"    python -m wmrl_envs.sandbox.cli build-image"
                + ("" if self.config.image is None else f" --tag {self.image}")
            )
        self._user: tuple[int, int] | None = None
        if self.config.user is not None:
            uid_s, _, gid_s = self.config.user.partition(":")
            self._user = (int(uid_s), int(gid_s))
        self._uids = None
        if self._user is None:
            lock_dir = self.config.lock_dir or (
                "/run/wmrl-sandbox"
                if os.geteuid() == 0
                else os.path.join(tempfile.gettempdir(), f"wmrl-sandbox-locks-{os.geteuid()}")
            )
            self._uids = UidPool(self.config.uid_base, self.config.uid_count, lock_dir)
        #: Labels every container of this executor (``org.wmrl.sandbox.executor``), e.g. to find leftovers.
        self.instance_id = uuid.uuid4().hex[:12]
        self._owner = _owner_label(os.getpid())
        sweep_containers(self.client)  # containers of grading processes that were SIGKILLed
        if os.geteuid() == 0:
            workfs.sweep_stale(self.config.work_base or tempfile.gettempdir())

    def run(
        self,
        script: str,
        *,
        inputs: Mapping[str, str | os.PathLike] | None = None,
        outputs: Sequence[str] = (),
        limits: Limits | None = None,
    ) -> ExecutionResult:
        """Run ``script`` as ``python3 main.py``; see :class:`~wmrl_envs.sandbox.base.Executor`."""
        limits = resolve_limits(limits)
        root = os.geteuid() == 0
        uid = self._uids.acquire() if self._uids is not None else None
        user = (uid, uid) if uid is not None else self._user
        assert user is not None  # a fixed user or one from the pool
        try:
            work = WorkDir(
                script,
                inputs,
                outputs,
                owner=user if root else None,
                base_dir=self.config.work_base,
                quota_bytes=limits.work_quota,
            )
            try:
                if not root:  # cannot chown: let the container's uid write anyway
                    os.chmod(work.path, 0o777)
                result = self._run_container(work, limits, f"{user[0]}:{user[1]}")
                files, oversized = work.read_outputs_checked(limits.read_cap)
            finally:
                work.cleanup()
        finally:
            if uid is not None and self._uids is not None:
                self._uids.release(uid)
        return ExecutionResult(**{**result, "files": files, "oversized_files": oversized})

    def _create(self, work: WorkDir, limits: Limits, hold: bool, user: str):
        from docker.types import LogConfig, Ulimit

        cpu = math.ceil(limits.cpu_seconds)
        # wall_seconds: the container ends itself even when no host process is left to stop it
        opts = {
            "sweep": True,
            "hold_seconds": _HOLD_SECONDS if hold else 0,
            "done_name": _DONE_NAME,
            "wall_seconds": limits.wall_seconds + LAUNCHER_WALL_GRACE,
        }
        command = [
            self.config.python,
            "-S",
            "-I",
            "-c",
            LAUNCHER_SOURCE,
            json.dumps(opts),
            self.config.python,
            "main.py",
        ]
        return self.client.containers.create(
            self.image,
            command,
            working_dir=SANDBOX_DIR,
            user=user,
            environment=dict(self.config.env),
            hostname="sandbox",
            network_mode="none",
            mem_limit=limits.memory_bytes,
            memswap_limit=limits.memory_bytes,
            pids_limit=limits.max_processes + 1,  # + the launcher
            nano_cpus=int(self.config.cpus * 1e9),
            read_only=True,
            tmpfs={
                "/tmp": f"size={limits.max_file_bytes},mode=1777",
                "/dev/shm": f"size={limits.max_file_bytes},mode=1777",
            },
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            ulimits=[
                Ulimit(name="cpu", soft=cpu, hard=cpu),
                Ulimit(name="data", soft=limits.memory_bytes, hard=limits.memory_bytes),
                Ulimit(name="fsize", soft=limits.max_file_bytes, hard=limits.max_file_bytes),
                Ulimit(name="core", soft=0, hard=0),
            ],
            volumes={str(work.path): {"bind": SANDBOX_DIR, "mode": "rw"}},
            log_config=LogConfig(type="none"),
            labels={
                "org.wmrl.sandbox": "run",
                "org.wmrl.sandbox.executor": self.instance_id,
                "org.wmrl.sandbox.owner": self._owner,
            },
            detach=True,
        )

    def _run_container(self, work: WorkDir, limits: Limits, user: str) -> dict:
        hold = _ContainerCgroup.visible()
        container = self._create(work, limits, hold, user)
        try:
            out, err = OutputTail(limits.tail_bytes), OutputTail(limits.tail_bytes)
            flooded = threading.Event()
            stream = container.attach(stdout=True, stderr=True, stream=True, logs=False, demux=True)

            def pump() -> None:
                # Keeps draining after the cap: the engine will not finish a killed
                # container while its attach stream is blocked.
                for chunk_out, chunk_err in stream:
                    out.add(chunk_out or b"")
                    err.add(chunk_err or b"")
                    if out.total + err.total > limits.max_output_bytes:
                        flooded.set()

            reader = threading.Thread(target=pump, name="wmrl-docker-output", daemon=True)
            reader.start()
            start = time.monotonic()
            container.start()
            comm = _launcher_comm(container) if hold else None
            killed, wall, cpu, peak = self._watch(container, limits, start, flooded, hold, comm)
            if killed:
                _signal(container, "SIGKILL")
            elif hold:
                _signal(container, "SIGTERM")  # stats are read: let the launcher exit with the code
            exit_code = _wait(container, _STOP_GRACE)
            if exit_code is None:  # the launcher ignored SIGTERM: it was tampered with
                log.warning(
                    "wmrl sandbox: the launcher did not exit %g s after SIGTERM; killing the container", _STOP_GRACE
                )
                _signal(container, "SIGKILL")
                exit_code = _wait(container, _STOP_GRACE)
                killed = killed or (
                    "error",
                    f"the sandbox launcher did not exit within {_STOP_GRACE:g} s of being asked "
                    "(tampered with by the script?); the container was killed",
                )
            reader.join(timeout=5)
            stream.close()
            container.reload()
            oom = container.attrs["State"].get("OOMKilled", False)
        finally:
            container.remove(force=True)
        if exit_code is None:  # still not gone after SIGKILL: removed by force above
            exit_code = 128 + 9
        returncode = -(exit_code - 128) if 128 < exit_code < 128 + 65 else exit_code  # 128 + signo, as shells do
        if killed:
            status, reason = killed
        elif oom:
            status, reason = "killed_memory", f"memory limit of {limits.memory_bytes} bytes exceeded (OOM-killed)"
        else:
            status, reason = classify_exit(returncode, err.text(), cpu, limits)
        return dict(
            status=status,
            returncode=returncode,
            stdout_tail=out.text(),
            stderr_tail=err.text(),
            wall_seconds=wall,
            cpu_seconds=cpu,
            peak_rss_bytes=peak,
            backend=self.backend,
            reason=reason,
        )

    def _watch(self, container, limits: Limits, start: float, flooded: threading.Event, hold: bool, comm: Path | None):
        """Wait for the script to finish or be killed: ``(killed, wall, cpu, peak)``.

        With the cgroup readable, the script is done when the launcher says so: it renames
        itself to ``_DONE_NAME`` once the script and everything it started are gone (read from
        its ``comm`` on the host, ``comm``); the counters are read then, while the launcher
        holds the cgroup alive. Where that file cannot be read (the host does not see the
        container's pids), the script is done when only the launcher is left in the cgroup
        (``pids.current == 1`` after more than one was seen) -- which a script shorter than a
        poll, or the runtime's start-up processes, can fool (a 30 ms script was once reported
        as a timeout under load, and another killed at start). Otherwise wait on the engine
        (and the counters stay unknown).
        """
        import requests.exceptions

        deadline = start + limits.wall_seconds
        cg, seen_script = None, False
        while True:
            now = time.monotonic()
            if hold and cg is None:
                cg = _ContainerCgroup.locate(container.id)
            pids = cg.pids() if cg else None
            if flooded.is_set() or now >= deadline:
                killed = (
                    ("killed_limit", f"output limit of {limits.max_output_bytes} bytes exceeded")
                    if flooded.is_set()
                    else ("timeout", f"wall time limit of {limits.wall_seconds:g} s exceeded")
                )
                return killed, now - start, *(cg.usage() if cg is not None and pids is not None else (None, None))
            if comm is not None and cg is not None:
                name = _read_text(comm)
                if name == _DONE_NAME:
                    return None, now - start, *cg.usage()
                if name is not None:  # the launcher is still waiting for the script
                    time.sleep(0.005)
                    continue
                comm = None  # the launcher is gone: the engine says how it ended
            if pids is not None:
                assert cg is not None  # pids are read from the cgroup
                if pids <= 1 and seen_script:
                    return None, now - start, *cg.usage()
                seen_script = seen_script or pids > 1
                time.sleep(0.005)
                continue
            try:  # no cgroup to watch (not visible, or already gone): ask the engine
                container.wait(timeout=0.05)
                return None, time.monotonic() - start, None, None
            except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
                continue


def _launcher_comm(container) -> Path | None:
    """``/proc/<pid>/comm`` of the container's launcher as this host sees it, or ``None`` where
    this process does not share the engine's pid namespace (checked: that pid's cgroup must
    name the container)."""
    container.reload()
    pid = container.attrs.get("State", {}).get("Pid") or 0
    if pid <= 0:
        return None
    cgroup = _read_text(Path(f"/proc/{pid}/cgroup"))
    return Path(f"/proc/{pid}/comm") if cgroup is not None and container.id in cgroup else None


def _read_text(path: Path) -> str | None:
    """The stripped text of a small ``/proc`` file; ``None`` once it is gone or unreadable."""
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _owner_label(pid: int) -> str:
    """``<boot id>:<pid>:<start time>`` of a host process: unique across pid reuse and reboots."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        start = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except OSError:
        return f"unknown:{pid}:0"
    return f"{boot}:{pid}:{start}"


def sweep_containers(client) -> int:
    """Remove sandbox containers whose creating process (on this host) is gone; how many.

    Containers of live processes, of other hosts sharing the engine, and of versions that
    did not label an owner are left alone. Never raises (a sweep is best effort).
    """
    removed = 0
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        containers = client.containers.list(all=True, filters={"label": "org.wmrl.sandbox=run"})
    except Exception as e:  # noqa: BLE001
        log.warning("wmrl sandbox: cannot list leftover containers: %r", e)
        return 0
    for c in containers:
        owner = (c.labels or {}).get("org.wmrl.sandbox.owner", "")
        o_boot, _, rest = owner.partition(":")
        pid_s, _, start = rest.partition(":")
        if not owner or not pid_s.isdigit():
            continue
        if o_boot == boot and _owner_label(int(pid_s)) == owner:
            continue  # its grading process is alive
        if o_boot != boot and o_boot != "unknown":
            # another boot of this host, or another host: dead if this is the same machine
            # rebooted; we cannot tell, so only containers no longer running are removed
            if c.status == "running":
                continue
        try:
            c.remove(force=True)
            removed += 1
        except Exception as e:  # noqa: BLE001
            log.warning("wmrl sandbox: cannot remove leftover container %s: %r", c.short_id, e)
    if removed:
        log.warning("wmrl sandbox: removed %d container(s) left by dead grading processes", removed)
    return removed


#: How long the launcher keeps a finished container alive for its counters to be read.
_HOLD_SECONDS = 5.0
#: The launcher's name once its script is over (``done_name``; at most 15 bytes).
_DONE_NAME = "wmrl-run-done"


#: How long the host waits for a container to exit after asking (SIGTERM), and again after
#: SIGKILL: every wait on the engine is bounded. An honest launcher exits at once and the wait
#: returns then; on a loaded host delivering the signal and reaping the container has taken
#: over 3 s (an honest run was then reported as a tampered launcher), so the bound is roomy.
_STOP_GRACE = 10.0


def _wait(container, timeout: float) -> int | None:
    """The container's exit code, or ``None`` if it has not exited within ``timeout`` seconds."""
    import requests.exceptions

    try:
        return int(container.wait(timeout=timeout)["StatusCode"])
    except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
        return None


def _signal(container, sig: str) -> None:
    import docker.errors

    try:
        container.kill(signal=sig)
    except docker.errors.APIError:
        pass  # already exited


class _ContainerCgroup:
    """The counters of a running container's cgroup (v1 ``cgroupfs`` or v2 layouts)."""

    def __init__(self, pids: Path, cpu: Path, cpu_v2: bool, memory: Path):
        self._pids, self._cpu, self._cpu_v2, self._memory = pids, cpu, cpu_v2, memory

    @staticmethod
    def visible() -> bool:
        """Whether the engine's container cgroups can be read from here."""
        return any(
            p.is_dir()
            for p in (
                _CGROUP_ROOT / "pids" / "docker",
                _CGROUP_ROOT / "pids" / "system.slice",
                _CGROUP_ROOT / "docker",
                _CGROUP_ROOT / "system.slice",
            )
        )

    @classmethod
    def locate(cls, container_id: str) -> _ContainerCgroup | None:
        v1 = {c: _CGROUP_ROOT / c / "docker" / container_id for c in ("pids", "cpuacct", "memory")}
        if v1["pids"].is_dir():
            return cls(
                v1["pids"] / "pids.current",
                v1["cpuacct"] / "cpuacct.usage",
                False,
                v1["memory"] / "memory.max_usage_in_bytes",
            )
        scope = f"docker-{container_id}.scope"  # systemd cgroup driver
        v1_systemd = {c: _CGROUP_ROOT / c / "system.slice" / scope for c in ("pids", "cpuacct", "memory")}
        if v1_systemd["pids"].is_dir():
            return cls(
                v1_systemd["pids"] / "pids.current",
                v1_systemd["cpuacct"] / "cpuacct.usage",
                False,
                v1_systemd["memory"] / "memory.max_usage_in_bytes",
            )
        for d in (_CGROUP_ROOT / "system.slice" / scope, _CGROUP_ROOT / "docker" / container_id):
            if d.is_dir():
                return cls(d / "pids.current", d / "cpu.stat", True, d / "memory.peak")
        return None

    def pids(self) -> int | None:
        try:
            return int(self._pids.read_text())
        except (OSError, ValueError):
            return None

    def usage(self) -> tuple[float | None, int | None]:
        """(CPU seconds, peak memory bytes incl. page cache); ``None`` where unreadable."""
        try:
            text = self._cpu.read_text()
            cpu = (
                int(dict(line.split() for line in text.splitlines())["usage_usec"]) / 1e6
                if self._cpu_v2
                else int(text) / 1e9
            )
        except (OSError, ValueError, KeyError):
            cpu = None
        try:
            peak = int(self._memory.read_text())
        except (OSError, ValueError):
            peak = None
        return cpu, peak
