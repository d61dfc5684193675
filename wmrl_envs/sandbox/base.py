"""What every sandbox backend shares: limits, results, the protocol, and work-dir handling.

A backend runs ``python3 main.py`` in a fresh work directory that holds copies of the
declared inputs (read-only: root-owned, mode 0444) and reads back the declared outputs.
Staging, output read-back, output capping and status classification live here so the
local and Docker backends report the same thing for the same script.

Classes: :class:`Limits`, :class:`ExecutionResult`, :class:`Executor`, :class:`Job`,
:class:`SandboxUnavailable`, :class:`WorkDir`, :class:`OutputTail`.
Functions: :func:`classify_exit`, :func:`resolve_limits`.
Constants: :data:`STATUSES`, :data:`SANDBOX_DIR`, :data:`DEFAULT_ENV`.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import signal
import stat
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Protocol, runtime_checkable

from wmrl_envs.sandbox.workfs import is_mount, mount_quota, remove_tree, unmount, write_owner

__all__ = [
    "STATUSES",
    "SANDBOX_DIR",
    "DEFAULT_ENV",
    "Limits",
    "ExecutionResult",
    "Executor",
    "Job",
    "SandboxUnavailable",
    "WorkDir",
    "OutputTail",
    "classify_exit",
    "resolve_limits",
]

#: Every value :attr:`ExecutionResult.status` can take.
STATUSES = ("ok", "error", "timeout", "killed_memory", "killed_limit")

#: Where the work directory appears inside the sandbox (the script's cwd).
SANDBOX_DIR = "/sandbox"

#: Environment of the sandboxed script. One BLAS/OpenMP thread: threads count against the
#: process limit and would make CPU time depend on the host's core count.
DEFAULT_ENV: Mapping[str, str] = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
    "MPLCONFIGDIR": "/tmp",
    "MPLBACKEND": "Agg",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}

_SCRIPT_NAME = "main.py"
log = logging.getLogger(__name__)


class SandboxUnavailable(RuntimeError):
    """The requested isolation cannot be provided here (missing bwrap, engine or image)."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one run.

    Attributes:
        wall_seconds: wall-clock budget; the whole sandbox is killed after it (``timeout``).
        cpu_seconds: CPU budget per process (``RLIMIT_CPU``); exceeding it is ``timeout``.
        memory_bytes: memory cap. Local: ``RLIMIT_DATA`` per process (heap + anonymous
            mappings; an allocation beyond it fails, usually as ``MemoryError``).
            Docker: the container's cgroup limit (the OOM killer). Either way: ``killed_memory``.
        max_processes: processes + threads the script may have at once (``RLIMIT_NPROC``
            for a uid used by this run alone; Docker: ``pids_limit``). Hitting it: ``killed_limit``.
        max_file_bytes: largest file the script may write (``RLIMIT_FSIZE``); ``killed_limit``.
            Also the size of the private ``/tmp`` tmpfs.
        max_output_bytes: stdout + stderr bytes together; the sandbox is killed when the
            script prints more (``killed_limit``).
        tail_bytes: how much of the end of stdout and of stderr is kept in the result.
        max_read_bytes: largest output file read back into the host process (``None``:
            ``max_file_bytes``). A larger one is not read at all; its size is reported in
            :attr:`ExecutionResult.oversized_files` (the caller decides what that means).
        max_work_bytes: total bytes the work dir may hold (inputs excluded), enforced by a
            size-capped tmpfs where the backend can mount one (``None``: 4 x
            ``max_file_bytes``). Writing past it fails with ``ENOSPC``.

    >>> Limits(wall_seconds=5, memory_bytes=256 << 20).cpu_seconds
    60.0
    """

    wall_seconds: float = 60.0
    cpu_seconds: float = 60.0
    memory_bytes: int = 2 << 30
    max_processes: int = 64
    max_file_bytes: int = 256 << 20
    max_output_bytes: int = 1 << 20
    tail_bytes: int = 8192
    max_read_bytes: int | None = None
    max_work_bytes: int | None = None

    def __post_init__(self) -> None:
        for name in ("wall_seconds", "cpu_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"Limits.{name} must be a positive number of seconds, got {value!r}")
            object.__setattr__(self, name, float(value))
        for name, minimum in (
            ("memory_bytes", 16 << 20),
            ("max_processes", 1),
            ("max_file_bytes", 1),
            ("max_output_bytes", 1),
            ("tail_bytes", 0),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"Limits.{name} must be an int >= {minimum}, got {value!r}")
        for name in ("max_read_bytes", "max_work_bytes"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"Limits.{name} must be an int >= 1 or None, got {value!r}")

    @property
    def read_cap(self) -> int:
        """Largest output file read back (``max_read_bytes``, else ``max_file_bytes``)."""
        return self.max_file_bytes if self.max_read_bytes is None else self.max_read_bytes

    @property
    def work_quota(self) -> int:
        """Bytes the script may add to its work dir (``max_work_bytes``, else 4 x ``max_file_bytes``)."""
        return 4 * self.max_file_bytes if self.max_work_bytes is None else self.max_work_bytes


@dataclass(frozen=True)
class ExecutionResult:
    """What happened when a script ran.

    Attributes:
        status: one of :data:`STATUSES`. ``ok``: exit code 0. ``error``: the script failed
            by itself (non-zero exit, uncaught exception). ``timeout``: wall or CPU budget
            exhausted. ``killed_memory``: memory cap hit. ``killed_limit``: output, file-size
            or process cap hit.
        returncode: exit code; negative signal number when killed by a signal (an exit
            code above 128 is read as 128 + signal number, as shells do); ``None`` when unknown.
        stdout_tail, stderr_tail: the last ``Limits.tail_bytes`` of each stream (UTF-8,
            undecodable bytes replaced).
        wall_seconds: wall time from launch to exit (includes sandbox start-up).
        cpu_seconds: user + system CPU time of the script and its children, ``None`` if unknown.
        peak_rss_bytes: peak resident memory (largest process locally, the container's
            cgroup under Docker), ``None`` if unknown.
        files: requested outputs that the script produced (relative path -> content).
        backend: which backend ran it (``local``, ``local-unsandboxed``, ``docker``).
        reason: one line explaining a non-``ok`` status (empty for ``ok``).
        oversized_files: requested outputs that exist but are larger than
            :attr:`Limits.read_cap` (relative path -> size in bytes); they are not in ``files``.
    """

    status: str
    returncode: int | None
    stdout_tail: str
    stderr_tail: str
    wall_seconds: float
    cpu_seconds: float | None
    peak_rss_bytes: int | None
    files: dict[str, bytes] = field(default_factory=dict)
    backend: str = ""
    reason: str = ""
    oversized_files: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"ExecutionResult.status must be one of {STATUSES}, got {self.status!r}")

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@runtime_checkable
class Executor(Protocol):
    """Runs an untrusted Python script under limits. Implementations must be thread-safe."""

    def run(
        self,
        script: str,
        *,
        inputs: Mapping[str, str | os.PathLike] | None = None,
        outputs: Sequence[str] = (),
        limits: Limits | None = None,
    ) -> ExecutionResult:
        """Run ``script`` as ``python3 main.py`` in a fresh work dir; see :mod:`wmrl_envs.sandbox`."""
        ...


@dataclass(frozen=True)
class Job:
    """One unit of work for :class:`~wmrl_envs.sandbox.pool.ExecutorPool`: the arguments of ``run``."""

    script: str
    inputs: Mapping[str, str | os.PathLike] = field(default_factory=dict)
    outputs: Sequence[str] = ()
    limits: Limits | None = None


def resolve_limits(limits: Limits | None) -> Limits:
    """``limits``, or the defaults for ``None``; a clear error for anything else."""
    if limits is None:
        return Limits()
    if not isinstance(limits, Limits):
        raise TypeError(f"limits must be a Limits (or None for the defaults), got {type(limits).__name__}")
    return limits


def _relative_path(path: str, what: str) -> PurePosixPath:
    """Validate a path that must stay inside the work dir."""
    if not isinstance(path, str) or not path:
        raise ValueError(f"{what} path must be a non-empty string, got {path!r}")
    p = PurePosixPath(path)
    if p.is_absolute() or any(part in ("..", "") for part in p.parts) or "\x00" in path:
        raise ValueError(f"{what} path must be relative and stay inside the work dir, got {path!r}")
    if not p.parts:
        raise ValueError(f"{what} path must name a file inside the work dir, got {path!r}")
    if str(p) == _SCRIPT_NAME:
        raise ValueError(f"{what} path {path!r} is reserved (the script is {_SCRIPT_NAME})")
    return p


class WorkDir:
    """A fresh host directory for one run, removed on :meth:`cleanup`.

    Layout: ``<base>/wmrl-sbx-XXXX/`` (mode 0711, root) holding ``owner`` (this process's
    ``pid:starttime``, for :func:`~wmrl_envs.sandbox.workfs.sweep_stale`) and ``work/``
    (owned by the sandbox uid, mode 0700). Only ``work/`` is ever mounted into a sandbox.
    Inputs and ``main.py`` are root-owned copies with mode 0444 inside it, so the script
    can read but not change them.

    With ``quota_bytes`` (and root), ``work/`` is a tmpfs of the inputs' size plus
    ``quota_bytes``: the script's writes are capped in total (``ENOSPC``), not only per
    file. :attr:`quota_enforced` says whether the mount succeeded.
    """

    def __init__(
        self,
        script: str,
        inputs: Mapping[str, str | os.PathLike] | None,
        outputs: Sequence[str],
        *,
        owner: tuple[int, int] | None,
        base_dir: str | None = None,
        quota_bytes: int | None = None,
    ):
        if not isinstance(script, str):
            raise TypeError(f"script must be a str of Python source, got {type(script).__name__}")
        if isinstance(outputs, str):
            raise TypeError(f"outputs must be a sequence of paths, got the string {outputs!r}")
        self.outputs = [str(_relative_path(o, "output")) for o in outputs]
        staged = {str(_relative_path(rel, "input")): Path(src) for rel, src in (inputs or {}).items()}
        for rel, src in staged.items():
            if not src.exists():
                raise FileNotFoundError(f"input {rel!r}: host path {str(src)!r} does not exist")
        self.quota_enforced = False
        self.root = Path(tempfile.mkdtemp(prefix="wmrl-sbx-", dir=base_dir))
        try:
            write_owner(self.root)
            os.chmod(self.root, 0o711)  # traversable (bwrap binds as the sandbox uid), not listable
            self.path = self.root / "work"
            self.path.mkdir(mode=0o700)
            if quota_bytes is not None and os.geteuid() == 0:
                size = quota_bytes + len(script.encode()) + sum(_tree_bytes(src) for src in staged.values())
                try:
                    mount_quota(self.path, size + (1 << 20))  # + room for the tmpfs's own metadata
                    self.quota_enforced = True
                except OSError as e:
                    _warn_no_quota(e)
            (self.path / _SCRIPT_NAME).write_text(script, encoding="utf-8")
            for rel, src in staged.items():
                dst = self.path / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                if src.is_dir():
                    shutil.copytree(src, dst, symlinks=False)
                else:
                    shutil.copyfile(src, dst)
            self._protect(self.path)
            if owner is not None:
                os.chown(self.path, *owner)
        except BaseException:
            self.cleanup()
            raise

    @staticmethod
    def _protect(work: Path) -> None:
        """Make every staged file read-only and every staged subdirectory non-writable."""
        for dirpath, dirnames, filenames in os.walk(work):
            for name in filenames:
                os.chmod(os.path.join(dirpath, name), 0o444)
            for name in dirnames:
                os.chmod(os.path.join(dirpath, name), 0o555)

    def read_outputs(self, max_bytes: int) -> dict[str, bytes]:
        """Read requested outputs without following links the script may have planted."""
        return self.read_outputs_checked(max_bytes)[0]

    def read_outputs_checked(self, max_bytes: int) -> tuple[dict[str, bytes], dict[str, int]]:
        """``(files, oversized)``: outputs of at most ``max_bytes`` are read; larger ones are
        only measured (``rel -> size``), so a huge output never enters this process.
        Never raises for what the script left (unreadable paths count as not written)."""
        files: dict[str, bytes] = {}
        oversized: dict[str, int] = {}
        for rel in self.outputs:
            try:
                data = _read_regular_file(self.path, PurePosixPath(rel).parts, max_bytes)
            except _Oversized as big:
                oversized[rel] = big.size
                continue
            except OSError as e:
                log.warning("wmrl sandbox: output %r unreadable: %r", rel, e)
                continue
            if data is not None:
                files[rel] = data
        return files, oversized

    def cleanup(self) -> bool:
        """Unmount the quota tmpfs and remove the whole work dir; True when it is gone.
        Never raises: a tree the script shaped (any depth, any modes) cannot stop it."""
        path = getattr(self, "path", None)
        if path is not None and is_mount(path):
            unmount(path)  # frees the quota tmpfs at once, whatever it holds
        return remove_tree(self.root)


def _tree_bytes(path: Path) -> int:
    """Bytes of a file or of every file under a directory (inputs to stage)."""
    if not path.is_dir():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


_quota_warned = False


def _warn_no_quota(err: OSError) -> None:
    global _quota_warned
    if not _quota_warned:
        _quota_warned = True
        log.warning(
            "wmrl sandbox: cannot mount a size-capped tmpfs on work dirs (%s); only the per-file "
            "cap (RLIMIT_FSIZE) bounds what a script writes to its work dir",
            err,
        )


class _Oversized(Exception):
    """An output file larger than the read cap (carries its size)."""

    def __init__(self, size: int):
        super().__init__(size)
        self.size = size


def _read_regular_file(base: Path, parts: tuple[str, ...], max_bytes: int) -> bytes | None:
    """Read ``base/parts...`` only if every component is a real dir/regular file (no symlinks, FIFOs)."""
    flags_dir = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    fds = [os.open(base, flags_dir)]
    try:
        for part in parts[:-1]:
            fds.append(os.open(part, flags_dir, dir_fd=fds[-1]))
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fds[-1])
        fds.append(fd)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        if st.st_size > max_bytes:
            raise _Oversized(st.st_size)
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(max_bytes)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.ENXIO):
            return None
        raise
    finally:
        for fd in fds:
            os.close(fd)


class OutputTail:
    """Counts bytes of one stream and keeps its last ``keep`` bytes."""

    def __init__(self, keep: int):
        self.keep = keep
        self.total = 0
        self._buf = bytearray()

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        if self.keep:
            self._buf += chunk[-self.keep :]
            del self._buf[: -self.keep]

    def text(self) -> str:
        return bytes(self._buf).decode("utf-8", errors="replace")


# Last line of a Python traceback naming the limit that was hit. A script could print
# these itself; it would only misreport its own failure, never hide one (the exit code
# must be non-zero too).
_MEMORY_RE = re.compile(
    r"^(MemoryError|numpy\.core\._exceptions\._ArrayMemoryError)\b|Cannot allocate memory|std::bad_alloc", re.M
)
_FSIZE_RE = re.compile(r"\[Errno 27\] File too large", re.M)
_NOSPC_RE = re.compile(r"\[Errno 28\] No space left on device", re.M)
_NPROC_RE = re.compile(r"^BlockingIOError: \[Errno 11\] Resource temporarily unavailable|can't start new thread", re.M)


def classify_exit(
    returncode: int | None, stderr_tail: str, cpu_seconds: float | None, limits: Limits
) -> tuple[str, str]:
    """``(status, reason)`` of a script that exited by itself (the supervisor did not kill it).

    ``returncode`` is negative for a signal death. CPU-limit deaths (SIGXCPU, or SIGKILL
    once the CPU budget is spent) count as ``timeout``: a CPU budget is a time budget.
    """
    if returncode == 0:
        return "ok", ""
    sig = -returncode if returncode is not None and returncode < 0 else None
    # rusage reads up to ~10% below the clock the kernel enforces RLIMIT_CPU with
    cpu_exhausted = cpu_seconds is not None and cpu_seconds >= 0.75 * limits.cpu_seconds
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_exhausted):
        return "timeout", f"CPU time limit of {limits.cpu_seconds:g} s exceeded"
    if sig == signal.SIGXFSZ:
        return "killed_limit", f"file size limit of {limits.max_file_bytes} bytes exceeded"
    if _MEMORY_RE.search(stderr_tail):
        return "killed_memory", f"memory limit of {limits.memory_bytes} bytes reached (allocation failed)"
    if _FSIZE_RE.search(stderr_tail):
        return "killed_limit", f"file size limit of {limits.max_file_bytes} bytes exceeded"
    if _NOSPC_RE.search(stderr_tail):
        return "killed_limit", f"work dir quota of {limits.work_quota} bytes exhausted (no space left on device)"
    if _NPROC_RE.search(stderr_tail):
        return "killed_limit", f"process limit of {limits.max_processes} reached (fork/thread creation failed)"
    if sig is not None:
        return "error", f"killed by signal {_signal_name(sig)}"
    return "error", f"exited with code {returncode}"


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)
