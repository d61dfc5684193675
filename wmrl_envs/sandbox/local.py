"""The default sandbox backend: bubblewrap namespaces + cgroup + rlimits + a dedicated non-root uid.

Layers, outermost first:

* **uid**: each concurrent run gets its own uid from a reserved numeric range (no passwd
  entry needed), so ``RLIMIT_NPROC`` -- which the kernel counts per uid, and ignores for
  root -- caps exactly that run's processes. A uid in an ``/etc/subuid`` range or used by
  any live process is never taken (:mod:`wmrl_envs.sandbox.uids`): the run kills every
  process of its uid at the end, so that uid must be nobody else's.
* **cgroup** (:mod:`wmrl_envs.sandbox.cgroup`, v1 or v2, per run): memory of every kind
  (heap, shared mappings, memfd, tmpfs, socket buffers, kernel memory) capped at
  ``memory_bytes`` plus a small headroom, ``pids.max``, and the CPU time of *all* processes
  of the run, waited for or not, checked against ``cpu_seconds`` while it runs. The
  launcher stays outside the group (only its forked child is moved in, before it execs):
  kernel memory a script leaves behind (e.g. a million empty files) stays charged after it
  exits, and an OOM kill in the group must take the script, never the launcher that reports
  its exit. Skipped with a warning where
  cgroups are not writable (then the rlimits below are all there is).
* **rlimits**: ``RLIMIT_CPU``, ``RLIMIT_DATA`` (so a plain memory bomb fails with
  ``MemoryError``), ``RLIMIT_FSIZE``, ``RLIMIT_NPROC``, ``RLIMIT_CORE=0``, set by a tiny
  launcher (:mod:`wmrl_envs.sandbox._launcher`, running as the sandbox uid) right before
  it execs ``bwrap``; the launcher also enforces the wall limit itself and dies with the
  grading process (``PR_SET_PDEATHSIG``), so a dead parent leaves nothing running.
* **bubblewrap**: new user/pid/net/ipc/uts/cgroup namespaces (no network: only an
  isolated loopback device), no nested user namespaces (``--disable-userns``), read-only
  mounts of only the Python runtime (the interpreter, its ``sys.path`` directories, the
  shared libraries, time zones -- not all of ``/usr``) and a few ``/etc`` files; this
  package's own directory is masked if it lies under one of them; a read-only root,
  size-capped private ``/tmp`` and ``/dev/shm``, the work dir bound read-write at
  ``/sandbox`` (the cwd), nothing else of the host: ``/root``, ``/home``, ``/work``,
  ``/var`` ... simply do not exist inside.
* **work dir**: a size-capped tmpfs (``Limits.work_quota``) removed after the run, by a
  cleanup that no tree shape can defeat (:mod:`wmrl_envs.sandbox.workfs`).
* **supervision**: stdout/stderr through pipes with a byte cap, a wall deadline, and a
  kill that takes the whole pid namespace down (``--die-with-parent``).

Without a working ``bwrap`` nothing runs: :class:`SandboxUnavailable` says why. Trusted
code may run without isolation only with the loudly named opt-out
``unsafe_no_isolation=True`` (or ``WMRL_SANDBOX_UNSAFE_NO_ISOLATION=1``): uid-dropped and
rlimited, but with the network and every world-readable host file in reach.

Known gaps: without writable cgroups, ``RLIMIT_DATA`` and ``RLIMIT_CPU`` are per process
(a script running ``k`` processes may use ``k`` times the budget; ``max_processes`` and the
wall limit bound this) and shared memory is unbounded but for the tmpfs sizes. The script
is its pid namespace's init, so signals it sends itself without a handler are ignored
(SIGKILL from outside always works).

Classes: :class:`LocalExecutor`, :class:`LocalConfig`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import selectors
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from wmrl_envs.sandbox import cgroup as _cgroup
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
from wmrl_envs.sandbox.runtime import runtime_python
from wmrl_envs.sandbox.uids import DEFAULT_UID_BASE, UidPool

__all__ = ["LocalExecutor", "LocalConfig", "LAUNCHER_SOURCE", "UNSAFE_ENV"]

#: Environment variable that, set to ``1``, allows the unisolated fallback (trusted code only).
UNSAFE_ENV = "WMRL_SANDBOX_UNSAFE_NO_ISOLATION"
#: Memory the run's cgroup allows beyond ``Limits.memory_bytes``: the launcher, bwrap and
#: the interpreter's file-backed pages, which ``RLIMIT_DATA`` does not count either.
CGROUP_HEADROOM = 64 << 20
#: The launcher's own wall deadline trails the host's by this much: the host's kill (with
#: its exact reason) normally comes first; the launcher's is for a host that died.
LAUNCHER_WALL_GRACE = 2.0

log = logging.getLogger(__name__)

# Processes of the sandbox uid that are not the script's (the launcher, and bwrap's
# monitor when sandboxed), added to Limits.max_processes so the script gets its full allowance.
# The run's cgroup holds all but the launcher.
_OVERHEAD_PROCS = {True: 2, False: 1}

#: Files of the sandbox's own /proc that still describe the host (the kernel command line,
#: the boot id, the host's load and uptime): masked with an empty file.
HOST_INFO_FILES = ("/proc/cmdline", "/proc/sys/kernel/random/boot_id", "/proc/loadavg", "/proc/uptime")

#: The interpreter when the pinned runtime is not built: Debian's, with its older libraries.
FALLBACK_PYTHON = "/usr/bin/python3"

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
        python: interpreter inside the sandbox; must be readable by the sandbox uid (not
            a venv under ``/root``). Default: the pinned solutions' runtime
            (:mod:`wmrl_envs.sandbox.runtime`, ``/opt/wmrl-runtime/bin/python``) when it is
            built, else Debian's ``/usr/bin/python3`` with a warning.
        bwrap: bubblewrap binary (name or path).
        strict: also refuse (raise :class:`SandboxUnavailable`) when not running as root
            (scripts would then run under the caller's uid, without a per-run process cap).
            A missing or unusable bwrap is always refused, ``strict`` or not.
        unsafe_no_isolation: run WITHOUT bubblewrap when it is unusable, for trusted code
            only: the script can then read every world-readable host file (hidden answers
            included, unless their directories are root-only) and use the network. Also
            enabled by ``$WMRL_SANDBOX_UNSAFE_NO_ISOLATION=1``.
        mount_usr: mount all of ``/usr`` (the old behaviour) instead of only the Python
            runtime the script needs.
        hidden_paths: host directories masked by an empty read-only tmpfs inside the sandbox
            when they lie under a mounted path (added to this package's own directory,
            which is always masked when visible).
        cgroups: put each run in its own cgroup (memory incl. shared memory, pids, CPU of
            all descendants) where ``/sys/fs/cgroup`` is writable.
        disable_userns: forbid nested user namespaces inside the sandbox
            (``bwrap --disable-userns``) where bwrap supports it.
        work_quota: make the work dir a size-capped tmpfs (``Limits.work_quota``) where
            mounting is allowed (root).
        uid_base: first uid of the range reserved for sandbox runs; uids with a passwd or
            group entry, in an ``/etc/subuid`` / ``/etc/subgid`` range, or used by any live
            process are skipped (:mod:`wmrl_envs.sandbox.uids`). Only used when the host
            process is root.
        uid_count: size of that range = the most local runs at once on this host, across
            processes (more wait).
        lock_dir: where the per-uid lock files live (root-only directory).
        ro_paths: extra host paths mounted read-only at the same place.
        env: the script's whole environment (nothing is inherited from the host).
        work_base: host directory for work dirs (``None``: the system temp dir).
    """

    python: str = field(default_factory=lambda: runtime_python() or FALLBACK_PYTHON)
    bwrap: str = "bwrap"
    strict: bool = False
    unsafe_no_isolation: bool = False
    mount_usr: bool = False
    hidden_paths: Sequence[str] = ()
    cgroups: bool = True
    disable_userns: bool = True
    work_quota: bool = True
    uid_base: int = DEFAULT_UID_BASE
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


def _empty_file(directory: str = "/run/wmrl-sandbox-public") -> str | None:
    """A root-owned, empty, world-readable file to mask host files with (a device node such as
    ``/dev/null`` cannot be bound into the sandbox's ``/proc``); ``None`` where it cannot be made."""
    path = os.path.join(directory, "empty")
    try:
        os.makedirs(directory, mode=0o755, exist_ok=True)
        st = os.lstat(path) if os.path.lexists(path) else None
        if st is None or st.st_uid != 0 or st.st_size != 0 or not stat.S_ISREG(st.st_mode):
            tmp = tempfile.mkstemp(dir=directory)
            os.close(tmp[0])
            os.chmod(tmp[1], 0o444)
            os.replace(tmp[1], path)
        return path
    except OSError as e:
        log.warning("wmrl sandbox: cannot make %s (%s); host files in /proc stay visible", path, e)
        return None


def _check_traversable(path: str) -> None:
    """bwrap binds the work dir as the sandbox uid, which must be able to walk down to it."""
    p = Path(path).resolve()
    for d in [p, *p.parents]:
        if not os.stat(d).st_mode & 0o001:
            raise ValueError(
                f"work_base {str(p)!r} is not reachable by the sandbox uid: {str(d)!r} is not "
                f"world-traversable (o+x); choose another work_base"
            )


class LocalExecutor:
    """Run untrusted scripts under bubblewrap, a per-run cgroup, rlimits and a throwaway uid.

    Thread-safe: share one instance across threads (see
    :class:`~wmrl_envs.sandbox.pool.ExecutorPool`). Construction removes what dead grading
    processes left behind (work dirs, cgroups) and raises :class:`SandboxUnavailable` when
    bubblewrap cannot isolate scripts here (see ``LocalConfig.unsafe_no_isolation``).

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
            UidPool(self.config.uid_base, self.config.uid_count, self.config.lock_dir) if self._is_root else None
        )
        base = self.config.work_base or tempfile.gettempdir()
        if self._is_root:
            _check_traversable(base)
            workfs.sweep_stale(base)  # work dirs of grading processes that were SIGKILLed
            if self.config.cgroups:
                _cgroup.sweep_stale()
        if self.config.python == FALLBACK_PYTHON and runtime_python() is None:
            log.warning(
                "wmrl sandbox: the pinned solutions' runtime is not built, so solutions run under Debian's "
                "python3 and its older libraries (no LightGBM / XGBoost). Build it: "
                "python -m wmrl_envs.sandbox.cli build-runtime"
            )
        self._runtime = self._runtime_mounts()
        self._empty_file = _empty_file() if self._is_root else None
        self._disable_userns = self.config.disable_userns
        self._bwrap, problem = self._probe_bwrap()
        if self._bwrap is None and self._disable_userns and problem and "disable-userns" in problem:
            log.warning("wmrl sandbox: bwrap --disable-userns unsupported here; nested user namespaces stay possible")
            self._disable_userns = False
            self._bwrap, problem = self._probe_bwrap()
        self.sandboxed = self._bwrap is not None
        self.backend = "local" if self.sandboxed else "local-unsandboxed"
        if problem:
            unsafe = self.config.unsafe_no_isolation or os.environ.get(UNSAFE_ENV) == "1"
            lost = (
                "NETWORK isolation (the script can open connections), FILESYSTEM isolation "
                "(it can read every world-readable host file and write wherever its uid may, "
                "e.g. /tmp), HIDDEN ANSWERS outside this process (only the private/ dirs of tasks "
                "loaded here are made root-only; another checkout's or cache's answers stay readable), "
                "PID isolation (processes that leave the process group escape the kill)"
            )
            if not unsafe:
                raise SandboxUnavailable(
                    f"wmrl sandbox: {problem}. Refusing to run untrusted code without isolation. For trusted "
                    f"code only, pass unsafe_no_isolation=True (or set {UNSAFE_ENV}=1) to run without it."
                )
            msg = (
                f"wmrl sandbox: {problem}. Running WITHOUT bubblewrap (unsafe_no_isolation) loses: {lost}. "
                f"Still enforced: rlimits" + (", non-root uid." if self._is_root else ".")
            )
            warnings.warn(msg, RuntimeWarning, stacklevel=2)
            log.warning(msg)
        self._cgroups = self.config.cgroups and self._is_root and _cgroup.available()
        if not self._is_root:
            msg = (
                "wmrl sandbox: not running as root, so scripts run under YOUR uid: the process "
                "limit (RLIMIT_NPROC counts all your processes), the per-run cgroup and the "
                "work-dir quota are not applied."
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
                [path, *self._mounts(), "--", self.config.python, "-c", "import encodings"],
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

    def _runtime_mounts(self) -> list[str]:
        """Host paths the interpreter needs, read-only: itself, its ``sys.path``, shared libs."""
        if self.config.mount_usr:
            return ["/usr"]
        python = self.config.python
        paths = {python, os.path.realpath(python)}
        link = python
        for _ in range(16):  # every hop of a symlink chain (venv/bin/python -> /usr/bin/python3 -> python3.11)
            if not os.path.islink(link):
                break
            link = os.path.normpath(os.path.join(os.path.dirname(link), os.readlink(link)))
            paths.add(link)
        prefix = str(Path(python).parent.parent)
        if os.path.exists(os.path.join(prefix, "pyvenv.cfg")):  # a venv: its pyvenv.cfg must be visible
            paths.add(prefix)
        try:
            out = subprocess.run(
                [
                    python,
                    "-I",
                    "-c",
                    "import sys, sysconfig, json; print(json.dumps([sys.path, "
                    "sysconfig.get_config_var('MULTIARCH') or '', sysconfig.get_config_var('LIBDIR') or '']))",
                ],
                capture_output=True,
                timeout=30,
                check=True,
            ).stdout
            sys_path, multiarch, libdir = json.loads(out)
        except (OSError, subprocess.SubprocessError, ValueError) as e:
            raise SandboxUnavailable(f"wmrl sandbox: cannot run the sandbox interpreter {python!r}: {e}") from None
        paths.update(p for p in sys_path if p and os.path.exists(p))
        for lib in (libdir, f"/usr/lib/{multiarch}" if multiarch else "", "/usr/lib64", "/usr/share/zoneinfo"):
            if lib and os.path.isdir(lib):
                paths.add(lib)
        # a path under another one is already visible
        kept = sorted(p for p in paths if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in paths))
        return kept

    def _masks(self) -> list[str]:
        """Visible paths to hide: this package (it ships the catalog's answers) and ``hidden_paths``."""
        package = str(Path(__file__).resolve().parent.parent)  # wmrl_envs/
        out = []
        for p in [package, *self.config.hidden_paths]:
            rp = os.path.realpath(p)
            visible = [*self._runtime, *self.config.ro_paths]
            if os.path.isdir(rp) and any(rp == m or rp.startswith(m.rstrip("/") + "/") for m in visible):
                out.append(rp)
        return out

    def _mounts(self) -> list[str]:
        # --as-pid-1: python is the namespace's init and bwrap's direct child, so bwrap's
        # waitpid -- hence our wait4 -- accounts its CPU time and peak RSS (bwrap's own init
        # reports the exit code through a pipe and is never waited for).
        args = ["--unshare-all", "--as-pid-1", "--die-with-parent", "--new-session", "--hostname", "sandbox"]
        if self._disable_userns:
            args += ["--unshare-user", "--disable-userns"]
        for path in self._runtime:
            args += ["--ro-bind", path, path]
        for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"):
            if os.path.islink(top):  # merged-/usr: recreate the symlink
                args += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                args += ["--ro-bind", top, top]
        for path in self.config.ro_paths:
            args += ["--ro-bind-try", path, path]
        for path in self._masks():
            args += ["--perms", "0555", "--size", "4096", "--tmpfs", path, "--remount-ro", path]
        args += ["--proc", "/proc"]
        if self._empty_file is not None:  # facts about the host a solution has no business reading
            for path in HOST_INFO_FILES:
                args += ["--ro-bind", self._empty_file, path]
        return args + ["--dev", "/dev"]

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
                script,
                inputs,
                outputs,
                owner=None if uid is None else (uid, uid),
                base_dir=self.config.work_base,
                quota_bytes=limits.work_quota if self.config.work_quota else None,
            )
            try:
                cg = (
                    _cgroup.RunCgroup.create(
                        limits.memory_bytes + CGROUP_HEADROOM,
                        limits.max_processes + _OVERHEAD_PROCS[self.sandboxed] - 1,
                    )
                    if self._cgroups
                    else None
                )
                try:
                    result = self._supervise(work, limits, uid, cg)
                finally:
                    if cg is not None:
                        cg.remove()
                files, oversized = work.read_outputs_checked(limits.read_cap)
            finally:
                work.cleanup()
        finally:
            if uid is not None and self._uids is not None:  # a uid comes only from the pool
                self._uids.release(uid)
        return ExecutionResult(**{**result, "files": files, "oversized_files": oversized})

    def _supervise(self, work: WorkDir, limits: Limits, uid: int | None, cg: _cgroup.RunCgroup | None) -> dict:
        report_r, report_w = os.pipe()
        go_r, go_w = os.pipe()
        pid_r, pid_w = os.pipe()
        opts = {
            "rlimits": self._rlimits(limits),
            "report_fd": report_w,
            "sweep": uid is not None,
            "go_fd": go_r,
            "pid_fd": pid_w,
            "wall_seconds": limits.wall_seconds + LAUNCHER_WALL_GRACE,
            "parent_pid": os.getpid(),
        }
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                [
                    self.config.python,
                    "-S",
                    "-I",
                    "-c",
                    LAUNCHER_SOURCE,
                    json.dumps(opts),
                    *self._command(str(work.path), limits),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=[report_w, go_r, pid_w],
                cwd="/" if self.sandboxed else str(work.path),
                env=dict(self.config.env),
                start_new_session=True,
                **self._user_kwargs(uid),
            )
        except BaseException:
            for fd in (report_r, go_w, pid_r):
                os.close(fd)
            raise
        finally:
            for fd in (report_w, go_r, pid_w):
                os.close(fd)
        try:
            child = _read_pid(pid_r, timeout=_START_TIMEOUT)
            if cg is not None and child is not None:
                cg.attach(child)  # before the go byte: the script is born inside the group
            if child is not None:
                os.write(go_w, b"1")
            else:
                log.warning("wmrl sandbox: the launcher reported no child within %g s", _START_TIMEOUT)
                _kill_group(proc.pid)
        except OSError as e:  # the launcher died before starting anything
            log.warning("wmrl sandbox: could not start the run: %r", e)
        finally:
            os.close(go_w)
            os.close(pid_r)
        with os.fdopen(report_r, "rb") as report:
            killed, out, err = self._pump(proc, limits, start, cg)
            wall = time.monotonic() - start
            raw = report.read()
        cg_cpu = cg.cpu_seconds() if cg is not None else None
        cg_peak = cg.peak_memory() if cg is not None else None
        oom = cg.oom_kills() if cg is not None else 0
        try:
            rep = json.loads(raw) if raw else None
        except ValueError:
            rep = None
        if rep is None:  # the launcher itself died: nothing is known about the script's exit
            return dict(
                status=killed[0] if killed else "error",
                returncode=None,
                stdout_tail=out.text(),
                stderr_tail=err.text(),
                wall_seconds=wall,
                cpu_seconds=cg_cpu,
                peak_rss_bytes=cg_peak,
                backend=self.backend,
                reason=killed[1] if killed else f"sandbox launcher failed (exit {proc.returncode})",
            )
        returncode = os.waitstatus_to_exitcode(rep["status"])
        if self.sandboxed and returncode > 128 and returncode - 128 < signal.NSIG:
            returncode = -(returncode - 128)  # bwrap reports a signal death as 128 + signo
        cpu = rep["utime"] + rep["stime"]
        if cg_cpu is not None:
            cpu = max(cpu, cg_cpu)  # the group also counts children nobody waited for
        if killed is None and rep.get("wall_killed"):
            killed = ("timeout", f"wall time limit of {limits.wall_seconds:g} s exceeded")
        if killed is None and oom and returncode != 0:
            killed = (
                "killed_memory",
                f"memory limit of {limits.memory_bytes} bytes exceeded (all memory of the run, incl. shared; OOM-killed)",
            )
        status, reason = killed or classify_exit(returncode, err.text(), cpu, limits)
        return dict(
            status=status,
            returncode=returncode,
            stdout_tail=out.text(),
            stderr_tail=err.text(),
            wall_seconds=wall,
            cpu_seconds=cpu,
            peak_rss_bytes=cg_peak if cg_peak is not None else rep["maxrss_kb"] * 1024,
            backend=self.backend,
            reason=reason,
        )

    @staticmethod
    def _pump(
        proc: subprocess.Popen, limits: Limits, start: float, cg: _cgroup.RunCgroup | None = None
    ) -> tuple[tuple[str, str] | None, OutputTail, OutputTail]:
        """Collect output until the launcher exits; kill on the wall deadline, the output
        cap, or (with a cgroup) when all processes of the run together used up the CPU budget."""
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
                if cg is not None and not exited:
                    used = cg.cpu_seconds()
                    if used is not None and used >= limits.cpu_seconds:
                        killed = (
                            "timeout",
                            f"CPU time limit of {limits.cpu_seconds:g} s exceeded (all processes of the run together)",
                        )
                        break
                    remaining = min(remaining, 0.1)  # poll the group's CPU counter
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


#: How long the host waits for the launcher to report its child's pid (a bounded wait:
#: the launcher is a few lines of Python that fork at once).
_START_TIMEOUT = 30.0


def _read_pid(fd: int, timeout: float) -> int | None:
    """The child pid the launcher writes to ``fd`` (``None`` on end of file or timeout)."""
    deadline = time.monotonic() + timeout
    data = b""
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0 and sel.select(left):
            chunk = os.read(fd, 32)
            if not chunk:
                break
            data += chunk
    return int(data) if data.isdigit() else None


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
