"""Per-run control groups for the local backend: memory, processes and CPU of the whole run.

Rlimits are per process and ``RLIMIT_DATA`` misses shared mappings, memfd, tmpfs pages
and socket buffers; only a memory cgroup bounds those, and only a cgroup sees the CPU
time of children nobody waits for. Each run gets its own cgroup, created before the
script starts and removed after it (processes killed first), under this process's own
cgroup (so any limit above it still applies), in a ``wmrl-sandbox`` directory:

* **v1** (``/sys/fs/cgroup/{memory,pids,cpuacct}``, what this project's CI machines have):
  ``memory.limit_in_bytes`` = ``memory.memsw.limit_in_bytes`` (anon, page cache, shmem/tmpfs,
  kernel memory), ``memory.kmem.tcp.limit_in_bytes`` (TCP buffers), ``pids.max``,
  ``cpuacct.usage``; OOM kills from ``memory.oom_control``.
* **v2** (unified ``/sys/fs/cgroup``): ``memory.max`` (+ ``memory.swap.max = 0``;
  includes shmem and socket memory), ``pids.max``, ``cpu.stat``; OOM kills from
  ``memory.events``; ``cgroup.kill``. Needs the memory/pids/cpu controllers delegated to
  this process's cgroup; where they are not, runs go without a cgroup and a warning says so.
  (Written to the kernel's documented interface but not exercised on the v1-only machines
  this project is tested on.)

Nothing host-wide changes: every cgroup this module creates (the ``wmrl-sandbox`` parent
included, once empty) is removed by the run that created it, or -- when that process was SIGKILLed -- by :func:`sweep_stale` at the next
executor start (groups are named ``<pid>-<starttime>-<n>``).

Classes: :class:`RunCgroup`. Functions: :func:`sweep_stale`, :func:`available`.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import threading
import time
from pathlib import Path

__all__ = ["RunCgroup", "sweep_stale", "available", "GROUP_DIR"]

log = logging.getLogger(__name__)

_ROOT = Path("/sys/fs/cgroup")
#: Directory (under this process's own cgroup) holding the per-run groups.
GROUP_DIR = "wmrl-sandbox"
_V1_CONTROLLERS = ("memory", "pids", "cpuacct")
_counter = itertools.count()
_warned = threading.Event()


def _own_paths() -> dict[str, str]:
    """controller (``""`` for v2) -> this process's cgroup path, from ``/proc/self/cgroup``."""
    out: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            out[c] = path
    return out


def _is_v2() -> bool:
    return (_ROOT / "cgroup.controllers").is_file()


def _group_bases() -> dict[str, Path]:
    """Where run groups are created: controller -> ``<mount><own path>/wmrl-sandbox``."""
    own = _own_paths()
    if _is_v2():
        return {"": _ROOT / own.get("", "/").lstrip("/") / GROUP_DIR}
    return {c: _ROOT / c / own.get(c, "/").lstrip("/") / GROUP_DIR for c in _V1_CONTROLLERS}


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _starttime(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


def _prepare_v2(base: Path) -> None:
    """Enable memory/pids/cpu for the run groups under ``base`` (``base`` holds no process)."""
    base.mkdir(exist_ok=True)
    enabled = set((base.parent / "cgroup.subtree_control").read_text().split())
    need = {"memory", "pids", "cpu"} - enabled
    if need:  # fails (EBUSY) when the parent holds processes: not delegated to us
        _write(base.parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in sorted(need)))
    enabled = set((base / "cgroup.subtree_control").read_text().split())
    need = {"memory", "pids", "cpu"} - enabled
    if need:
        _write(base / "cgroup.subtree_control", " ".join(f"+{c}" for c in sorted(need)))


class RunCgroup:
    """One run's cgroup(s). Create with :meth:`create`; :meth:`remove` when the run is over."""

    def __init__(self, dirs: dict[str, Path], v2: bool):
        self.dirs, self.v2 = dirs, v2

    @classmethod
    def create(cls, memory_bytes: int, max_pids: int) -> RunCgroup | None:
        """A fresh group limited to ``memory_bytes`` (no swap) and ``max_pids`` tasks, or
        ``None`` when cgroups cannot be used here (the first failure is logged as a warning)."""
        name = f"{os.getpid()}-{_starttime(os.getpid())}-{next(_counter)}"
        made: dict[str, Path] = {}
        try:
            v2 = _is_v2()
            for controller, base in _group_bases().items():
                for attempt in range(5):  # another run may remove an empty base between our two mkdirs
                    if v2:
                        _prepare_v2(base)
                    else:
                        base.mkdir(exist_ok=True)
                    try:
                        (base / name).mkdir()
                        break
                    except FileNotFoundError:
                        if attempt == 4:
                            raise
                made[controller] = base / name
            cg = cls(made, v2)
            cg._limit(memory_bytes, max_pids)
            return cg
        except OSError as e:
            for d in made.values():
                _rmdir(d)
            if not _warned.is_set():
                _warned.set()
                log.warning(
                    "wmrl sandbox: per-run cgroups unavailable (%s); memory outside RLIMIT_DATA "
                    "(shared mappings, tmpfs, socket buffers) and the CPU of unwaited children "
                    "are not bounded",
                    e,
                )
            return None

    def _limit(self, memory_bytes: int, max_pids: int) -> None:
        if self.v2:
            d = self.dirs[""]
            _write(d / "memory.max", str(memory_bytes))
            try:
                _write(d / "memory.swap.max", "0")
            except FileNotFoundError:  # no swap accounting: nothing to swap to either
                pass
            _write(d / "pids.max", str(max_pids))
            return
        mem = self.dirs["memory"]
        _write(mem / "memory.limit_in_bytes", str(memory_bytes))
        try:
            _write(mem / "memory.memsw.limit_in_bytes", str(memory_bytes))
        except (FileNotFoundError, PermissionError):  # swap accounting off: no swap to escape to
            pass
        try:  # setting a limit is what turns TCP buffer accounting on in v1
            _write(mem / "memory.kmem.tcp.limit_in_bytes", str(memory_bytes))
        except OSError:
            pass
        _write(self.dirs["pids"] / "pids.max", str(max_pids))

    def attach(self, pid: int) -> None:
        """Move ``pid`` into every hierarchy of the group (before it starts the script)."""
        for d in self.dirs.values():
            _write(d / "cgroup.procs", str(pid))

    def cpu_seconds(self) -> float | None:
        """CPU time of every process that ever ran in the group (waited for or not)."""
        try:
            if self.v2:
                stat = dict(line.split() for line in (self.dirs[""] / "cpu.stat").read_text().splitlines())
                return int(stat["usage_usec"]) / 1e6
            return int((self.dirs["cpuacct"] / "cpuacct.usage").read_text()) / 1e9
        except (OSError, ValueError, KeyError):
            return None

    def peak_memory(self) -> int | None:
        """Peak memory charged to the group (anon, page cache, shmem), bytes."""
        try:
            if self.v2:
                return int((self.dirs[""] / "memory.peak").read_text())
            return int((self.dirs["memory"] / "memory.max_usage_in_bytes").read_text())
        except (OSError, ValueError):
            return None

    def oom_kills(self) -> int:
        """How many processes the kernel OOM-killed for this group's memory limit."""
        try:
            text = (
                self.dirs[""] / "memory.events" if self.v2 else self.dirs["memory"] / "memory.oom_control"
            ).read_text()
            return int(dict(line.split() for line in text.splitlines()).get("oom_kill", 0))
        except (OSError, ValueError):
            return 0

    def pids(self) -> list[int]:
        d = self.dirs[""] if self.v2 else self.dirs["pids"]
        try:
            return [int(p) for p in (d / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def kill_all(self, timeout: float = 5.0) -> bool:
        """SIGKILL every process in the group until it is empty; True when empty."""
        deadline = time.monotonic() + timeout
        while True:
            pids = self.pids()
            if not pids:
                return True
            if time.monotonic() > deadline:
                return False
            if self.v2:
                try:
                    _write(self.dirs[""] / "cgroup.kill", "1")
                except OSError:
                    pass
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.005)

    def remove(self) -> bool:
        """Kill what is left and delete the group; never raises. True when fully removed."""
        try:
            self.kill_all()
        except Exception as e:  # noqa: BLE001 -- cleanup must not raise out of a run
            log.warning("wmrl sandbox: killing cgroup members failed: %r", e)
        gone = all([_rmdir(d) for d in self.dirs.values()])
        for d in self.dirs.values():  # the wmrl-sandbox parent too, once no run uses it
            try:
                d.parent.rmdir()
            except OSError:  # other runs' groups still in it (or already removed)
                pass
        return gone


def _rmdir(d: Path) -> bool:
    for _ in range(200):  # a killed task leaves the group a moment after it is reaped
        try:
            d.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            time.sleep(0.01)
    log.warning("wmrl sandbox: cannot remove cgroup %s", d)
    return False


def available() -> bool:
    """Whether a run cgroup can be created here now (creates and removes one)."""
    cg = RunCgroup.create(64 << 20, 8)
    return cg is not None and cg.remove()


def sweep_stale() -> int:
    """Kill and remove run groups whose creating process is gone; returns how many."""
    removed = 0
    try:
        bases = _group_bases()
    except OSError:
        return 0
    by_name: dict[str, dict[str, Path]] = {}
    for controller, base in bases.items():
        try:
            for d in base.iterdir():
                if d.is_dir():
                    by_name.setdefault(d.name, {})[controller] = d
        except OSError:
            continue
    for name, dirs in by_name.items():
        pid_s, _, rest = name.partition("-")
        start = rest.rsplit("-", 1)[0]
        try:
            alive = _starttime(int(pid_s)) == start
        except (OSError, ValueError, IndexError):
            alive = False
        if not alive and RunCgroup(dirs, _is_v2()).remove():
            removed += 1
    if removed:
        log.warning("wmrl sandbox: removed %d cgroup(s) left by dead grading processes", removed)
    return removed
