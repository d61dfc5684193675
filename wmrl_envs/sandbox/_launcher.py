"""Sandbox launcher: run as the sandbox uid, *outside* the sandbox, by ``python3 -S -I -c``.

Usage: ``python3 -S -I -c <this file> REPORT_FD OWN_UID LIMITS_JSON CMD...`` where LIMITS_JSON
maps ``RLIMIT_*`` names to ``[soft, hard]`` and OWN_UID is ``1`` when this uid belongs to this
run alone (then every process of the uid is the sandbox's, and is swept at the end).

Forks, applies the rlimits in the child (single-threaded here, so that is safe), execs
``CMD`` (bwrap), waits for it and writes ``{"status", "utime", "stime", "maxrss_kb"}`` as
JSON to ``REPORT_FD``. It exists because ``wait4`` in the (possibly large) host process
would report the host's own RSS as the sandbox's peak: a forked child starts with its
parent's resident set counted. This process is tiny, so its children's figures are the
sandbox's. SIGTERM makes it SIGKILL the sandbox and still report. With OWN_UID it returns
only once no other process of its uid is left (so the uid can be reused at once).

Reads only the standard library; must run under any python3 >= 3.8.
"""

import json
import os
import resource
import signal
import sys
import time


def main() -> None:
    report_fd = int(sys.argv[1])
    own_uid = sys.argv[2] == "1"
    limits = json.loads(sys.argv[3])
    cmd = sys.argv[4:]
    child = [0]

    def kill_child(signum, frame):
        if own_uid:
            os.kill(-1, signal.SIGKILL)  # every process of this uid but us: the whole sandbox
        elif child[0]:
            os.kill(child[0], signal.SIGKILL)

    signal.signal(signal.SIGTERM, kill_child)
    pid = os.fork()
    if pid == 0:
        try:
            os.close(report_fd)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            for name, (soft, hard) in limits.items():
                resource.setrlimit(getattr(resource, name), (soft, hard))
            os.execv(cmd[0], cmd)
        except BaseException as e:  # noqa: BLE001 -- nothing may escape a forked child
            os.write(2, ("wmrl sandbox launcher: cannot start %r: %r\n" % (cmd[0], e)).encode())
        os._exit(127)
    child[0] = pid
    _, status, ru = os.wait4(pid, 0)
    if own_uid:
        _sweep()
    report = {"status": status, "utime": ru.ru_utime, "stime": ru.ru_stime, "maxrss_kb": ru.ru_maxrss}
    os.write(report_fd, json.dumps(report).encode())


def _sweep(timeout: float = 5.0) -> None:
    """SIGKILL every other process of this uid until /proc shows none (the dying linger until reaped)."""
    deadline = time.monotonic() + timeout
    me, uid = os.getpid(), os.getuid()
    while time.monotonic() < deadline:
        left = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != me:
                try:
                    if os.stat("/proc/" + entry).st_uid == uid:
                        left.append(entry)
                except OSError:
                    continue
        if not left:
            return
        os.kill(-1, signal.SIGKILL)  # never fails for lack of targets: don't rely on ESRCH
        time.sleep(0.005)

main()
