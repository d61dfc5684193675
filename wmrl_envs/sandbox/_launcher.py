"""Sandbox launcher: the first process of every run, started as ``python3 -S -I -c <this file>``.

Usage: ``python3 -S -I -c <this file> OPTIONS_JSON CMD...`` with OPTIONS_JSON keys
(every key optional, so callers of older versions keep working):

* ``rlimits``: ``RLIMIT_*`` name -> ``[soft, hard]``, applied to CMD only.
* ``report_fd``: fd that receives ``{"status", "utime", "stime", "maxrss_kb", "wall_killed"}``
  as JSON once CMD has exited (or ``null``).
* ``sweep``: every other process of this uid (or of this container) belongs to the run:
  SIGKILL them all when CMD exits, and return only once none is left.
* ``hold_seconds``: after that, stay alive up to this long until SIGTERM, then exit with
  CMD's exit code (``128 + signal`` for a signal death). The Docker backend uses this to
  read the container's cgroup counters before the engine deletes the cgroup.
* ``go_fd``: the forked child reads one byte from this fd before it execs CMD (the host
  moves that child -- not the launcher -- into the run's cgroup first, so an OOM kill in the
  run's group can never take the launcher); end of file means the host is gone: the child
  exits 125 without running CMD.
* ``pid_fd``: fd that receives the forked child's pid (decimal ASCII) right after the fork,
  for the host to move it into the run's cgroup before sending the go byte.
* ``wall_seconds``: the launcher's own deadline: CMD (everything, with ``sweep``) is killed
  after this long even if nobody is left to tell it to (``wall_killed`` in the report).
* ``parent_pid``: die with that process: ``PR_SET_PDEATHSIG`` delivers SIGTERM to the
  launcher when it exits (checked once after arming, for a parent already gone).
* ``done_name``: once CMD has exited (and, with ``sweep``, nothing else is left), rename the
  launcher to this (``PR_SET_NAME``, at most 15 bytes): the Docker host reads
  ``/proc/<pid>/comm`` to know the run is over, however short it was. Counting the
  container's processes cannot tell "not started yet" from "finished", and the runtime's own
  start-up processes pass through the same cgroup. CMD cannot forge it: the launcher is
  non-dumpable, so its ``comm`` is not writable by its uid's other processes.

SIGTERM while CMD runs kills it (everything, with ``sweep``) and the launcher still reports.

The launcher makes itself non-dumpable (``PR_SET_DUMPABLE 0``) before anything else: CMD
runs under the same uid (on Docker, in the same pid namespace), and a dumpable process of
one's own uid can be ptraced or have its memory rewritten through ``/proc/<pid>/mem`` --
which would let a solution disable the launcher's alarm and its exit (``execve`` makes CMD
dumpable again; only the launcher is protected, which is what matters).

Local backend: runs as the sandbox uid outside bwrap, so ``wait4`` in this tiny process
yields the sandbox's true CPU time and peak RSS (``wait4`` in the host process would count
the host's own resident set, which a forked child starts with). Docker backend: the
container's pid 1.

The launcher is a child subreaper (``PR_SET_CHILD_SUBREAPER``): a process of the run orphaned
by a kill (bwrap's pid-1 child, when its monitor dies first; a daemonised grandchild) becomes
the launcher's child, so the sweep reaps it. Without that it went to the host's init, and its
zombie -- still counted as a process of the uid -- outlived the launcher whenever that init
reaped later than the sweep's timeout: the uid was then released with a process on it.

Standard library only; runs under any python3 >= 3.9.
"""

import json
import os
import resource
import signal
import sys
import time


def main() -> None:  # noqa: C901 -- complexity over 15 before the limit (issue 26)
    _undumpable()
    _prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: the run's orphans are ours to reap (docstring)
    opts = json.loads(sys.argv[1])
    cmd = sys.argv[2:]
    state = {"child": 0, "stop": False, "wall": False}

    def kill_run():
        try:
            if opts.get("sweep"):
                os.kill(-1, signal.SIGKILL)  # every process of this uid but us: the whole sandbox
            elif state["child"]:
                os.kill(state["child"], signal.SIGKILL)
        except ProcessLookupError:  # nothing left to kill
            pass

    def on_term(signum, frame):
        state["stop"] = True
        kill_run()

    def on_alarm(signum, frame):
        state["wall"] = True
        kill_run()

    signal.signal(signal.SIGTERM, on_term)
    if opts.get("parent_pid"):
        _die_with_parent(int(opts["parent_pid"]))
    report_fd = opts.get("report_fd")
    go_fd = opts.get("go_fd")
    pid_fd = opts.get("pid_fd")
    if opts.get("wall_seconds"):
        signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, float(opts["wall_seconds"]))
    pid = os.fork()
    state["child"] = pid
    if pid == 0:
        _exec_child(cmd, opts.get("rlimits", {}), go_fd, (report_fd, pid_fd))
    if go_fd is not None:
        os.close(go_fd)
    if pid_fd is not None:
        try:
            os.write(pid_fd, str(pid).encode())
        except OSError:  # the host is gone: the child reads end of file and exits
            pass
        os.close(pid_fd)
    while True:
        try:
            _, status, ru = os.wait4(pid, 0)
            break
        except InterruptedError:  # PEP 475 retries, but be explicit for old interpreters
            continue
    signal.setitimer(signal.ITIMER_REAL, 0)
    if opts.get("sweep"):
        _sweep()
    if opts.get("done_name"):
        _set_name(str(opts["done_name"]))
    if report_fd is not None:
        report = {
            "status": status,
            "utime": ru.ru_utime,
            "stime": ru.ru_stime,
            "maxrss_kb": ru.ru_maxrss,
            "wall_killed": state["wall"],
        }
        try:
            os.write(report_fd, json.dumps(report).encode())
        except OSError:  # the host is gone; nobody to report to
            pass
    deadline = time.monotonic() + opts.get("hold_seconds", 0)
    while not state["stop"] and time.monotonic() < deadline:
        time.sleep(0.005)
    code = os.waitstatus_to_exitcode(status)
    os._exit(128 - code if code < 0 else code)


def _exec_child(cmd, rlimits, go_fd, close_fds) -> None:
    """The forked child: wait for the go byte (the host moves it into the run's cgroup
    first), apply the rlimits and exec CMD. Never returns."""
    try:
        for fd in close_fds:
            if fd is not None:
                os.close(fd)
        signal.setitimer(signal.ITIMER_REAL, 0)
        for sig in (signal.SIGTERM, signal.SIGALRM):
            signal.signal(sig, signal.SIG_DFL)
        if go_fd is not None:
            try:
                go = os.read(go_fd, 1)
            except OSError:
                go = b""
            os.close(go_fd)
            if not go:  # the host died before the run started
                os._exit(125)
        for name, (soft, hard) in rlimits.items():
            resource.setrlimit(getattr(resource, name), (soft, hard))
        os.execv(cmd[0], cmd)
    except BaseException as e:  # noqa: BLE001 -- nothing may escape a forked child
        os.write(2, f"wmrl sandbox launcher: cannot start {cmd[0]!r}: {e!r}\n".encode())
    os._exit(127)


def _prctl(option: int, arg: int) -> bool:
    """``prctl(option, arg)`` through libc; False where unsupported (not Linux, no ctypes)."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0) == 0
    except (OSError, AttributeError, ImportError):
        return False


def _set_name(name: str) -> bool:
    """``PR_SET_NAME``: this process's ``comm`` (truncated to 15 bytes by the kernel)."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(15, ctypes.c_char_p(name.encode()), 0, 0, 0) == 0
    except (OSError, AttributeError, ImportError):
        return False


def _undumpable() -> None:
    """``PR_SET_DUMPABLE 0``: no ptrace, no ``/proc/<pid>/mem`` for processes of our uid."""
    _prctl(4, 0)


def _die_with_parent(parent_pid: int) -> None:
    """Get SIGTERM when the host process dies (Linux ``prctl``); no-op where unsupported."""
    if not _prctl(1, signal.SIGTERM):  # PR_SET_PDEATHSIG
        return
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os.kill(os.getpid(), signal.SIGTERM)


def _real_uid(pid: str):
    """Real uid of a process from ``/proc/<pid>/status`` (not the owner of ``/proc/<pid>``,
    which is root for a process that made itself non-dumpable); ``None`` once it is gone."""
    try:
        with open("/proc/" + pid + "/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _sweep(timeout: float = 5.0) -> None:
    """SIGKILL every other process of this uid until /proc shows none (the dying linger until reaped)."""
    deadline = time.monotonic() + timeout
    me, uid = str(os.getpid()), os.getuid()
    while time.monotonic() < deadline:
        left = [e for e in os.listdir("/proc") if e.isdigit() and e != me and _real_uid(e) == uid]
        if not left:
            return
        try:
            os.kill(-1, signal.SIGKILL)  # on a host, never ESRCH (others' processes count): scan /proc
        except ProcessLookupError:
            pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:  # as a container's pid 1, orphans are ours to reap
                pass
        except ChildProcessError:
            pass
        time.sleep(0.002)


main()
