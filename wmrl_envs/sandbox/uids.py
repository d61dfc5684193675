"""Throwaway uids for sandbox runs: one per concurrent run, never one the host uses.

A run's uid is what the kernel counts ``RLIMIT_NPROC`` and per-user limits (inotify
instances, ...) against, and what the launcher's sweep kills (``kill(-1)`` as that uid
reaches every process of it). So a sandbox uid must belong to nobody else:

* no passwd or group entry;
* outside every subordinate-id range in ``/etc/subuid`` and ``/etc/subgid`` (rootless
  containers and user namespaces of other users run their processes there);
* no live process (zombies included) when the run takes it: a uid in use is skipped, never
  cleaned up -- a process this pool did not start is not ours to kill.

The default range starts at 2,100,000,000: above Debian's ``SUB_UID_MAX`` (600,100,000)
and systemd's container ranges (up to 1,879,048,191), below 2^31 (some tools treat uids as
signed).

A uid is held through an exclusive ``flock`` on ``<lock_dir>/<uid>.lock``, so distinct host
processes (and threads: each acquisition opens its own file) never run the same uid at once.

Classes: :class:`UidPool`. Functions: :func:`subordinate_ranges`, :func:`uid_processes`.
"""

from __future__ import annotations

import fcntl
import grp
import logging
import os
import pwd
import threading
import time
from collections.abc import Container, Iterable

__all__ = ["UidPool", "DEFAULT_UID_BASE", "subordinate_ranges", "uid_processes"]

log = logging.getLogger(__name__)

#: First uid of the default sandbox range (see the module docstring for why there).
DEFAULT_UID_BASE = 2_100_000_000
SUBID_FILES = ("/etc/subuid", "/etc/subgid")


def subordinate_ranges(paths: Iterable[str] = SUBID_FILES) -> list[tuple[int, int]]:
    """``(first, count)`` of every subordinate-id allocation in ``paths`` (missing files: none).

    >>> import tempfile, os
    >>> with tempfile.NamedTemporaryFile("w", suffix="subuid", delete=False) as f:
    ...     _ = f.write("alice:100000:65536\\n# comment\\nbob:165536:65536\\n")
    >>> subordinate_ranges([f.name])
    [(100000, 65536), (165536, 65536)]
    >>> os.unlink(f.name)
    """
    out = []
    for path in paths:
        try:
            with open(path) as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        for line in lines:
            fields = line.strip().split(":")
            if len(fields) == 3 and fields[1].isdigit() and fields[2].isdigit():
                out.append((int(fields[1]), int(fields[2])))
    return out


def uid_processes(uids: Container[int]) -> dict[int, list[int]]:
    """Live processes (zombies included) whose real, effective, saved or fs uid is in ``uids``:
    uid -> pids. Read from ``/proc/<pid>/status``: the owner of ``/proc/<pid>`` is root for a
    process that made itself non-dumpable, whatever its uid."""
    found: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                line = next(line for line in f if line.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        for uid in {int(u) for u in line.split()[1:]}:
            if uid in uids:
                found.setdefault(uid, []).append(int(entry))
    return found


def _has_entry(uid: int) -> bool:
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(uid)
            return True
        except KeyError:
            continue
    return False


class UidPool:
    """Hands out distinct, unused uids (see the module docstring).

    Args:
        base: first uid of the range.
        count: size of the range = the most runs at once on this host, across processes.
        lock_dir: where the per-uid lock files live (created 0700).
        subid_files: subordinate-id files whose ranges are excluded.

    Raises ``ValueError`` naming the reason when no uid of the range is usable.
    """

    def __init__(self, base: int, count: int, lock_dir: str, subid_files: Iterable[str] = SUBID_FILES):
        subids = subordinate_ranges(subid_files)
        in_subids = [u for u in range(base, base + count) if any(s <= u < s + n for s, n in subids)]
        with_entry = [u for u in range(base, base + count) if _has_entry(u)]
        self.uids = [u for u in range(base, base + count) if u not in set(in_subids) | set(with_entry)]
        if not self.uids:
            raise ValueError(
                f"no usable sandbox uid in [{base}, {base + count}): {len(in_subids)} lie in /etc/subuid or "
                f"/etc/subgid ranges, {len(with_entry)} have a passwd/group entry; pick another uid_base"
            )
        if in_subids:
            log.warning(
                "wmrl sandbox: %d uid(s) of [%d, %d) lie in subordinate-id ranges and are not used",
                len(in_subids),
                base,
                base + count,
            )
        os.makedirs(lock_dir, mode=0o700, exist_ok=True)
        self._lock_dir = lock_dir
        self._held: dict[int, int] = {}  # uid -> fd of its lock file
        self._mutex = threading.Lock()
        self._warned: set[int] = set()

    def acquire(self) -> int:
        """A uid no other run holds and no process uses; waits while every uid is busy."""
        delay = 0.005
        while True:
            for uid in self.uids:
                fd = os.open(os.path.join(self._lock_dir, f"{uid}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:  # another run holds it
                    os.close(fd)
                    continue
                users = uid_processes({uid}).get(uid)
                if users:  # not a run of ours (they hold the lock while they live): skip, never kill
                    os.close(fd)
                    if uid not in self._warned:
                        self._warned.add(uid)
                        log.warning(
                            "wmrl sandbox: uid %d is used by process(es) %s that no sandbox run holds; skipping it",
                            uid,
                            users[:5],
                        )
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
