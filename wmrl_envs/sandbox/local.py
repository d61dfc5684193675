"""The default sandbox backend: bubblewrap namespaces + rlimits + a dedicated non-root uid.

Layers, outermost first:

* **uid**: each concurrent run gets its own uid from a reserved numeric range (no passwd
  entry needed), so ``RLIMIT_NPROC`` -- which the kernel counts per uid, and ignores for
  root -- caps exactly that run's processes.
* **rlimits**: ``RLIMIT_CPU``, ``RLIMIT_DATA`` (memory), ``RLIMIT_FSIZE``, ``RLIMIT_NPROC``,
  ``RLIMIT_CORE=0``, set by a tiny launcher (:mod:`wmrl_envs.sandbox._launcher`, running as
  the sandbox uid) right before it execs ``bwrap``; the launcher also reports the
  sandbox's CPU time and peak RSS (``wait4`` here would count the host's own RSS).
* **bubblewrap**: new user/pid/net/ipc/uts/cgroup namespaces (no network: only an
  isolated loopback device), read-only ``/usr`` and a few ``/etc`` files, a read-only
  root, size-capped private ``/tmp`` and ``/dev/shm``, the work dir bound read-write at
  ``/sandbox`` (the cwd), nothing else of the host: ``/root``, ``/home``, ``/work``,
  ``/var`` ... simply do not exist inside.
* **supervision**: stdout/stderr through pipes with a byte cap, a wall deadline, and a
  kill that takes the whole pid namespace down (``--die-with-parent``).

Without a working ``bwrap`` the run is still uid-dropped and rlimited, but the script can
use the network and read every world-readable host file; a loud warning says so and
``strict=True`` refuses instead.

Known gaps (the Docker backend closes the first two with cgroups): ``RLIMIT_DATA`` and
``RLIMIT_CPU`` are per process, so a script running ``k`` processes may use up to ``k``
times the memory and CPU budget (``max_processes`` and the wall limit bound this); the
``/tmp`` and ``/dev/shm`` tmpfs use memory outside ``RLIMIT_DATA``; the work dir is on the
host's disk with only a per-file cap. The script is its pid namespace's init, so signals
it sends itself without a handler are ignored (SIGKILL from outside always works).

Classes: :class:`LocalExecutor`, :class:`LocalConfig`.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import pwd
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

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

__all__ = ["LocalExecutor", "LocalConfig", "LAUNCHER_SOURCE"]

log = logging.getLogger(__name__)

# Processes of the sandbox uid that are not the script's (the launcher, and bwrap's
# monitor when sandboxed), added to Limits.max_processes so the script gets its full allowance.
_OVERHEAD_PROCS = {True: 2, False: 1}

#: Host paths visible (read-only) inside the sandbox besides /usr; missing ones are skipped.
DEFAULT_RO_PATHS = (
    "/etc/alternatives",  # libblas/liblapack are alternatives symlinks
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/python3",
    "/etc/python3.11",
    "/etc/mime.types",
)


@dataclass(frozen=True)
class LocalConfig:
    """Settings of :class:`LocalExecutor`.

    Attributes:
        python: interpreter inside the sandbox; must be readable by the sandbox uid
            (Debian's ``/usr/bin/python3``, not a venv under ``/root``).
        bwrap: bubblewrap binary (name or path).
        strict: refuse to run (raise :class:`SandboxUnavailable`) when bwrap is unusable,
            instead of running with a loud warning.
        uid_base: first uid of the range reserved for sandbox runs; uids with a passwd
            entry are skipped. Only used when the host process is root.
        uid_count: size of that range = the most local runs at once on this host, across
            processes (more wait).
        lock_dir: where the per-uid lock files live (root-only directory).
        ro_paths: extra host paths mounted read-only at the same place.
        env: the script's whole environment (nothing is inherited from the host).
        work_base: host directory for work dirs (``None``: the system temp dir).
    """

    python: str = "/usr/bin/python3"
    bwrap: str = "bwrap"
    strict: bool = False
    uid_base: int = 300_000
    uid_count: int = 64
    lock_dir: str = "/run/wmrl-sandbox"
    ro_paths: Sequence[str] = DEFAULT_RO_PATHS
    env: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_ENV))
    work_base: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.uid_base, int) or self.uid_base < 1000:
            raise ValueError(f"LocalConfig.uid_base must be an int >= 1000, got {self.uid_base!r}")
        if not isinstance(self.uid_count, int) or self.uid_count < 1:
            raise ValueError(f"LocalConfig.uid_count must be a positive int, got {self.uid_count!r}")


class _UidPool:
    """Hands out distinct uids so concurrent runs never share an ``RLIMIT_NPROC`` count.

    A uid is held through an exclusive ``flock`` on ``<lock_dir>/<uid>.lock``, so distinct
    host processes (and threads: each acquisition opens its own file) never run the same uid.
    """

    def __init__(self, base: int, count: int, lock_dir: str):
        self._uids = [u for u in range(base, base + count) if not _uid_has_passwd_entry(u)]
        if not self._uids:
            raise ValueError(f"every uid in [{base}, {base + count}) has a passwd entry; pick another uid_base")
        os.makedirs(lock_dir, mode=0o700, exist_ok=True)
        self._lock_dir = lock_dir
        self._held: dict[int, int] = {}  # uid -> fd of its lock file
        self._mutex = threading.Lock()

    def acquire(self) -> int:
        delay = 0.005
        while True:
            for uid in self._uids:
                fd = os.open(os.path.join(self._lock_dir, f"{uid}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                with self._mutex:
                    self._held[uid] = fd
                return uid
            time.sleep(delay)  # every uid busy: wait for a run to finish
            delay = min(delay * 2, 0.2)

    def release(self, uid: int) -> None:
        with self._mutex:
            fd = self._held.pop(uid)
        os.close(fd)  # drops the flock


def _check_traversable(path: str) -> None:
    """bwrap binds the work dir as the sandbox uid, which must be able to walk down to it."""
    p = Path(path).resolve()
    for d in [p, *p.parents]:
        if not os.stat(d).st_mode & 0o001:
            raise ValueError(
                f"work_base {str(p)!r} is not reachable by the sandbox uid: {str(d)!r} is not "
                f"world-traversable (o+x); choose another work_base"
            )


def _uid_has_passwd_entry(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


class LocalExecutor:
    """Run untrusted scripts under bubblewrap, rlimits and a throwaway non-root uid.

    Thread-safe: share one instance across threads (see
    :class:`~wmrl_envs.sandbox.pool.ExecutorPool`).

    >>> ex = LocalExecutor()
    >>> r = ex.run("with open('submission.csv', 'w') as f: print('id,y', file=f)",
    ...            outputs=["submission.csv"], limits=Limits(wall_seconds=10))
    >>> r.status, r.files["submission.csv"]
    ('ok', b'id,y\\n')
    """

    def __init__(self, config: LocalConfig | None = None, **overrides):
        self.config = config or LocalConfig()
        if overrides:
            self.config = LocalConfig(**{**self.config.__dict__, **overrides})
        self._is_root = os.geteuid() == 0
        self._uids = (
            _UidPool(self.config.uid_base, self.config.uid_count, self.config.lock_dir) if self._is_root else None
        )
        if self._is_root:
            _check_traversable(self.config.work_base or tempfile.gettempdir())
        self._bwrap, problem = self._probe_bwrap()
        self.sandboxed = self._bwrap is not None
        self.backend = "local" if self.sandboxed else "local-unsandboxed"
        if problem:
            lost = (
                "NETWORK isolation (the script can open connections), FILESYSTEM isolation "
                "(it can read every world-readable host file and write wherever its uid may, "
                "e.g. /tmp), PID isolation (processes that leave the process group escape the kill)"
            )
            msg = f"wmrl sandbox: {problem}. Running WITHOUT bubblewrap loses: {lost}. Still enforced: rlimits" + (
                ", non-root uid." if self._is_root else "."
            )
            if self.config.strict:
                raise SandboxUnavailable(msg + " Refusing to run because strict=True.")
            warnings.warn(msg, RuntimeWarning, stacklevel=2)
            log.warning(msg)
        if not self._is_root:
            msg = (
                "wmrl sandbox: not running as root, so scripts run under YOUR uid: the process "
                "limit (RLIMIT_NPROC counts all your processes) is not applied."
            )
            if self.config.strict:
                raise SandboxUnavailable(msg + " Refusing to run because strict=True.")
            warnings.warn(msg, RuntimeWarning, stacklevel=2)

    # -- setup -------------------------------------------------------------------------

    def _probe_bwrap(self) -> tuple[str | None, str | None]:
        """(bwrap path, None) when a namespaced no-op run works as the sandbox uid, else (None, why)."""
        path = shutil.which(self.config.bwrap)
        if path is None:
            return None, f"bubblewrap ({self.config.bwrap!r}) is not installed (apt-get install bubblewrap)"
        uid = self._uids.acquire() if self._uids else None
        try:
            proc = subprocess.run(
                [path, *self._mounts(), "--", self.config.python, "-c", "pass"],
                capture_output=True,
                timeout=30,
                cwd="/",
                **self._user_kwargs(uid),
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, f"bubblewrap failed to start a sandbox: {e}"
        finally:
            if uid is not None and self._uids is not None:  # a uid comes only from the pool
                self._uids.release(uid)
        if proc.returncode != 0:
            err = proc.stderr.decode(errors="replace").strip()
            return None, f"bubblewrap cannot create a sandbox here (rc={proc.returncode}: {err})"
        return path, None

    @staticmethod
    def _user_kwargs(uid: int | None) -> dict:
        return {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}

    def _mounts(self) -> list[str]:
        # --as-pid-1: python is the namespace's init and bwrap's direct child, so bwrap's
        # waitpid -- hence our wait4 -- accounts its CPU time and peak RSS (bwrap's own init
        # reports the exit code through a pipe and is never waited for).
        args = [
            "--unshare-all",
            "--as-pid-1",
            "--die-with-parent",
            "--new-session",
            "--hostname",
            "sandbox",
            "--ro-bind",
            "/usr",
            "/usr",
        ]
        for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"):
            if os.path.islink(top):  # merged-/usr: recreate the symlink
                args += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                args += ["--ro-bind", top, top]
        for path in self.config.ro_paths:
            args += ["--ro-bind-try", path, path]
        return args + ["--proc", "/proc", "--dev", "/dev"]

    def _rlimits(self, limits: Limits) -> dict[str, tuple[int, int]]:
        """``RLIMIT_*`` name -> (soft, hard), equal: the script cannot raise them. (SIGXCPU
        would not help: the script is the pid namespace's init, which ignores it.)"""
        cpu = math.ceil(limits.cpu_seconds)
        rl = {
            "RLIMIT_CPU": (cpu, cpu),
            "RLIMIT_DATA": (limits.memory_bytes,) * 2,
            "RLIMIT_FSIZE": (limits.max_file_bytes,) * 2,
            "RLIMIT_CORE": (0, 0),
        }
        if self._is_root:  # for any other uid it would count all of the caller's processes
            nproc = limits.max_processes + _OVERHEAD_PROCS[self.sandboxed]
            rl["RLIMIT_NPROC"] = (nproc, nproc)
        return rl

    def _command(self, work: str, limits: Limits) -> list[str]:
        if not self.sandboxed:
            return [self.config.python, "main.py"]
        assert self._bwrap is not None  # sandboxed means bubblewrap was found
        size = str(limits.max_file_bytes)
        # Writable: the work dir, and size-capped tmpfs at /tmp and /dev/shm. bwrap builds the
        # rest of the tree on a tmpfs of its own, which is remounted read-only last.
        return [
            self._bwrap,
            *self._mounts(),
            "--size",
            size,
            "--tmpfs",
            "/tmp",
            "--size",
            size,
            "--tmpfs",
            "/dev/shm",
            "--remount-ro",
            "/dev",
            "--bind",
            work,
            SANDBOX_DIR,
            "--chdir",
            SANDBOX_DIR,
            "--remount-ro",
            "/",
            "--",
            self.config.python,
            "main.py",
        ]

    # -- running -----------------------------------------------------------------------

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
        uid = self._uids.acquire() if self._uids else None
        try:
            work = WorkDir(
                script, inputs, outputs, owner=None if uid is None else (uid, uid), base_dir=self.config.work_base
            )
            try:
                result = self._supervise(work, limits, uid)
                files, oversized = work.read_outputs_checked(limits.read_cap)
            finally:
                work.cleanup()
        finally:
            if uid is not None and self._uids is not None:  # a uid comes only from the pool
                self._uids.release(uid)
        return ExecutionResult(**{**result, "files": files, "oversized_files": oversized})

    def _supervise(self, work: WorkDir, limits: Limits, uid: int | None) -> dict:
        report_r, report_w = os.pipe()
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                [
                    self.config.python,
                    "-S",
                    "-I",
                    "-c",
                    LAUNCHER_SOURCE,
                    json.dumps({"rlimits": self._rlimits(limits), "report_fd": report_w, "sweep": uid is not None}),
                    *self._command(str(work.path), limits),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=[report_w],
                cwd="/" if self.sandboxed else str(work.path),
                env=dict(self.config.env),
                start_new_session=True,
                **self._user_kwargs(uid),
            )
        except BaseException:
            os.close(report_r)
            raise
        finally:
            os.close(report_w)
        with os.fdopen(report_r, "rb") as report:
            killed, out, err = self._pump(proc, limits, start)
            wall = time.monotonic() - start
            raw = report.read()
        if not raw:  # the launcher itself died: nothing is known about the script's exit
            return dict(
                status=killed[0] if killed else "error",
                returncode=None,
                stdout_tail=out.text(),
                stderr_tail=err.text(),
                wall_seconds=wall,
                cpu_seconds=None,
                peak_rss_bytes=None,
                backend=self.backend,
                reason=killed[1] if killed else f"sandbox launcher failed (exit {proc.returncode})",
            )
        rep = json.loads(raw)
        returncode = os.waitstatus_to_exitcode(rep["status"])
        if self.sandboxed and returncode > 128 and returncode - 128 < signal.NSIG:
            returncode = -(returncode - 128)  # bwrap reports a signal death as 128 + signo
        cpu = rep["utime"] + rep["stime"]
        status, reason = killed or classify_exit(returncode, err.text(), cpu, limits)
        return dict(
            status=status,
            returncode=returncode,
            stdout_tail=out.text(),
            stderr_tail=err.text(),
            wall_seconds=wall,
            cpu_seconds=cpu,
            peak_rss_bytes=rep["maxrss_kb"] * 1024,
            backend=self.backend,
            reason=reason,
        )

    @staticmethod
    def _pump(
        proc: subprocess.Popen, limits: Limits, start: float
    ) -> tuple[tuple[str, str] | None, OutputTail, OutputTail]:
        """Collect output until the launcher exits; kill on the wall deadline or the output cap."""
        assert proc.stdout is not None and proc.stderr is not None  # started with stdout/stderr=PIPE
        out, err = OutputTail(limits.tail_bytes), OutputTail(limits.tail_bytes)
        killed: tuple[str, str] | None = None
        pidfd = os.pidfd_open(proc.pid)
        sel = selectors.DefaultSelector()
        try:
            sel.register(proc.stdout, selectors.EVENT_READ, out)
            sel.register(proc.stderr, selectors.EVENT_READ, err)
            sel.register(pidfd, selectors.EVENT_READ, None)
            exited = False
            deadline = start + limits.wall_seconds
            while killed is None and (not exited or len(sel.get_map()) > 0):
                remaining = deadline - time.monotonic()
                if exited:  # the sandbox is gone; its pipes close at once, don't hang on stragglers
                    remaining = min(remaining, 1.0)
                if remaining <= 0:
                    if not exited:
                        killed = ("timeout", f"wall time limit of {limits.wall_seconds:g} s exceeded")
                    break
                for key, _ in sel.select(remaining):
                    if key.data is None:
                        exited = True
                        sel.unregister(pidfd)
                        continue
                    chunk = os.read(key.fd, 1 << 16)
                    if not chunk:
                        sel.unregister(key.fileobj)
                        continue
                    key.data.add(chunk)
                    if out.total + err.total > limits.max_output_bytes:
                        killed = ("killed_limit", f"output limit of {limits.max_output_bytes} bytes exceeded")
            if killed and not exited:
                _stop(proc)
        finally:
            sel.close()
            os.close(pidfd)
            proc.stdout.close()
            proc.stderr.close()
            if proc.poll() is None:  # an exception escaped: never leak a sandbox
                _stop(proc)
            proc.wait()
        return killed, out, err


#: Source of :mod:`wmrl_envs.sandbox._launcher`, passed to ``python3 -c`` (the sandbox uid
#: may not be able to read this package's files).
LAUNCHER_SOURCE = Path(__file__).with_name("_launcher.py").read_text()


def _stop(proc: subprocess.Popen) -> None:
    """Ask the launcher to SIGKILL the sandbox (so it can still report); force it after 2 s."""
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)


def _kill_group(pid: int) -> None:
    # The group holds the launcher and bwrap's monitor; their death takes the namespace
    # down (--die-with-parent).
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
