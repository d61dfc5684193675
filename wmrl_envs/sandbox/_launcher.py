"""Sandbox launcher: run as the sandbox uid, *outside* the sandbox, by ``python3 -S -I -c``.

Usage: ``python3 -S -I -c <this file> REPORT_FD LIMITS_JSON CMD...`` where LIMITS_JSON maps
``RLIMIT_*`` names to ``[soft, hard]``.

Forks, applies the rlimits in the child (single-threaded here, so that is safe), execs
``CMD`` (bwrap), waits for it and writes ``{"status", "utime", "stime", "maxrss_kb"}`` as
JSON to ``REPORT_FD``. It exists because ``wait4`` in the (possibly large) host process
would report the host's own RSS as the sandbox's peak: a forked child starts with its
parent's resident set counted. This process is tiny, so its children's figures are the
sandbox's. SIGTERM makes it SIGKILL the sandbox and still report.

Reads only the standard library; must run under any python3 >= 3.8.
"""

import json
import os
import resource
import signal
import sys


def main() -> None:
    report_fd = int(sys.argv[1])
    limits = json.loads(sys.argv[2])
    cmd = sys.argv[3:]
    child = [0]

    def kill_child(signum, frame):
        if child[0]:
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
    report = {"status": status, "utime": ru.ru_utime, "stime": ru.ru_stime, "maxrss_kb": ru.ru_maxrss}
    os.write(report_fd, json.dumps(report).encode())


main()
