"""The host side of a work directory: size quota, removal that cannot be defeated, stale sweep.

* :func:`mount_quota` puts a size-capped tmpfs on the work dir (root only), so the script's
  total writes are bounded (``ENOSPC`` past the quota), not just each file. Its pages are
  charged to the memory cgroup of the process that writes them, i.e. the sandbox's.
* :func:`remove_tree` deletes a tree the script shaped: any depth (no recursion, no path
  longer than one name: every directory is first *renamed* into a flat graveyard directory
  of ours, so at most three directory fds are open at a time), any permission bits (reset
  before each open), symlinks never followed. It never raises; what it cannot remove it reports.
* :func:`sweep_stale` removes work dirs whose owning process died (SIGKILL of a grader):
  each work dir records ``pid:starttime`` of its owner in ``owner``.

Python 3.11's ``shutil.rmtree`` recurses once per directory level, so a 1,500-deep tree
raised ``RecursionError`` out of the executor and left the tree on the host.

Functions: :func:`remove_tree`, :func:`mount_quota`, :func:`unmount`, :func:`is_mount`,
:func:`write_owner`, :func:`sweep_stale`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["remove_tree", "mount_quota", "unmount", "is_mount", "write_owner", "sweep_stale", "OWNER_FILE"]

log = logging.getLogger(__name__)

#: Name of the file in a work dir's root that records its owner process.
OWNER_FILE = "owner"
_PREFIX = "wmrl-sbx-"
_MS_NOSUID, _MS_NODEV = 2, 4
_MNT_DETACH = 2
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _oserror(what: str, path: str | os.PathLike) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, f"{what}: {os.strerror(err)}", str(path))


def mount_quota(path: str | os.PathLike, size_bytes: int, uid: int | None = None) -> None:
    """Mount a tmpfs of ``size_bytes`` (mode 0700, owned by ``uid``) on the directory ``path``.

    Raises ``OSError`` when the kernel refuses (not root, no ``CAP_SYS_ADMIN``).
    """
    opts = f"size={int(size_bytes)},mode=0700" + ("" if uid is None else f",uid={uid},gid={uid}")
    if _libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs", _MS_NOSUID | _MS_NODEV, opts.encode()) != 0:
        raise _oserror("mount tmpfs", path)


def unmount(path: str | os.PathLike) -> bool:
    """Lazily unmount ``path`` (its pages are freed once no process uses them); True on success."""
    if _libc.umount2(os.fsencode(path), _MNT_DETACH) != 0:
        log.warning("wmrl sandbox: cannot unmount %s: %s", path, os.strerror(ctypes.get_errno()))
        return False
    return True


def is_mount(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a mount point (a different device than its parent)."""
    try:
        return os.path.ismount(path)
    except OSError:
        return False


def _open_dir(name: str, dir_fd: int | None) -> int:
    # Make it openable whatever bits the script left (root needs no bits, another uid does).
    try:
        os.chmod(name, 0o700, dir_fd=dir_fd, follow_symlinks=False)
    except (OSError, NotImplementedError):
        pass
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)


def _empty_flat(top_fd: int, grave_fd: int) -> int:
    """Unlink every non-directory under ``top_fd``; every directory met is first moved into
    the (fresh, ours) ``grave_fd`` directory under a counter name, and emptied from there.
    Returns how many directories now sit, empty, in the grave (named ``1..n``)."""
    n = 0
    todo: list[int | None] = [None]  # None: the top directory itself
    while todo:
        item = todo.pop()
        fd = top_fd if item is None else _open_dir(str(item), grave_fd)
        try:
            with os.scandir(fd) as it:
                entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
            for child, is_dir in entries:
                if is_dir:
                    n += 1
                    os.rename(child, str(n), src_dir_fd=fd, dst_dir_fd=grave_fd)
                    todo.append(n)
                else:
                    os.unlink(child, dir_fd=fd)
        finally:
            if fd != top_fd:
                os.close(fd)
    return n


def remove_tree(path: str | os.PathLike) -> bool:
    """Delete ``path`` and everything under it; True when it is gone. Never raises.

    A mount point inside is not crossed (the fd pass fails on it: ``rm -rf
    --one-file-system`` is tried as the last resort, and what stays is logged).
    """
    p = Path(path)
    grave: str | None = None
    try:
        if not os.path.lexists(p):
            return True
        if p.is_symlink() or not p.is_dir():
            os.unlink(p)
            return True
        top_fd = _open_dir(str(p), None)
        grave = tempfile.mkdtemp(prefix=".wmrl-rm-", dir=p.parent)
        grave_fd = _open_dir(grave, None)
        try:
            n = _empty_flat(top_fd, grave_fd)
            for i in range(n, 0, -1):
                os.rmdir(str(i), dir_fd=grave_fd)
        finally:
            os.close(top_fd)
            os.close(grave_fd)
        os.rmdir(grave)
        os.rmdir(p)
        return True
    except Exception as e:  # noqa: BLE001 -- cleanup must never raise out of an executor
        log.warning("wmrl sandbox: fd-based removal of %s failed (%r); trying rm -rf", p, e)
    try:
        targets = [str(p)] + ([grave] if grave else [])
        subprocess.run(["rm", "-rf", "--one-file-system", "--", *targets], capture_output=True, timeout=300)
    except Exception as e:  # noqa: BLE001
        log.error("wmrl sandbox: rm -rf %s failed: %r", p, e)
    gone = not os.path.lexists(p)
    if not gone:
        log.error("wmrl sandbox: could not remove %s; it stays on the host", p)
    return gone


def _starttime(pid: int) -> str | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()[19]  # field 22: start time in clock ticks since boot


def write_owner(root: str | os.PathLike) -> None:
    """Record this process as the owner of the work dir ``root``."""
    pid = os.getpid()
    Path(root, OWNER_FILE).write_text(f"{pid}:{_starttime(pid)}\n")


def _owner_alive(root: Path) -> bool:
    try:
        pid_s, _, start = (root / OWNER_FILE).read_text().strip().partition(":")
        pid = int(pid_s)
    except (OSError, ValueError):
        # no owner file yet: a work dir being created right now, or one from an older
        # version; only very old ones are stale
        try:
            return time.time() - root.stat().st_mtime < 24 * 3600
        except OSError:
            return False
    return _starttime(pid) == start


def sweep_stale(base: str | os.PathLike) -> int:
    """Unmount and remove work dirs under ``base`` whose owner process is gone; how many."""
    removed = 0
    try:
        candidates = [p for p in Path(base).iterdir() if p.name.startswith(_PREFIX)]
    except OSError:
        return 0
    for root in candidates:
        try:
            if not root.is_dir() or root.is_symlink() or root.stat().st_uid != os.geteuid():
                continue
            if _owner_alive(root):
                continue
            work = root / "work"
            if is_mount(work):
                unmount(work)
            if remove_tree(root):
                removed += 1
        except Exception as e:  # noqa: BLE001 -- a sweep is best effort and never fatal
            log.warning("wmrl sandbox: sweeping %s failed: %r", root, e)
    if removed:
        log.warning("wmrl sandbox: removed %d work dir(s) left behind by dead grading processes in %s", removed, base)
    return removed
