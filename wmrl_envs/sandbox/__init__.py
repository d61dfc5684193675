"""Executing untrusted solution code: the Executor protocol and its backends.

A script runs as ``python3 main.py`` in a fresh work directory (its cwd, ``/sandbox``
inside the sandbox) that holds read-only copies of the declared ``inputs``; the declared
``outputs`` are read back if the script wrote them; everything else is thrown away.

>>> from wmrl_envs.sandbox import default_executor, Limits
>>> r = default_executor("local").run("print(6 * 7)", limits=Limits(wall_seconds=10))
>>> r.status, r.stdout_tail
('ok', '42\\n')

Backends: :class:`LocalExecutor` (bubblewrap + rlimits + non-root uid; the default) and
:class:`DockerExecutor` (Docker engine; build its image once with
``python -m wmrl_envs.sandbox.cli build-image``). :class:`ExecutorPool` runs batches.
``WMRL_SANDBOX=docker`` makes :func:`default_executor` pick Docker; ``WMRL_SANDBOX=ray``
picks :class:`RayExecutor` (each run a Ray task on a local instance or the cluster at
``$RAY_ADDRESS``, isolated on its node by the local or Docker backend; needs the ``ray`` extra).

Classes: :class:`Limits`, :class:`ExecutionResult`, :class:`Executor`, :class:`Job`,
:class:`LocalExecutor`, :class:`DockerExecutor`, :class:`RayExecutor`, :class:`ExecutorPool`,
:class:`SandboxUnavailable`, :class:`SandboxHarnessError`. Functions: :func:`default_executor`.
Constants: :data:`BACKENDS` (the names :func:`default_executor` and the CLIs accept).
"""

from __future__ import annotations

import os

from wmrl_envs.sandbox.base import STATUSES, ExecutionResult, Executor, Job, Limits, SandboxUnavailable
from wmrl_envs.sandbox.docker_backend import DockerExecutor
from wmrl_envs.sandbox.local import LocalExecutor
from wmrl_envs.sandbox.pool import ExecutorPool
from wmrl_envs.sandbox.ray_executor import RayExecutor, SandboxHarnessError

__all__ = [
    "STATUSES",
    "Limits",
    "ExecutionResult",
    "Executor",
    "Job",
    "LocalExecutor",
    "DockerExecutor",
    "RayExecutor",
    "ExecutorPool",
    "SandboxUnavailable",
    "SandboxHarnessError",
    "BACKENDS",
    "default_executor",
]

_BACKENDS: dict[str, type] = {"local": LocalExecutor, "docker": DockerExecutor, "ray": RayExecutor}

#: Backend names accepted by :func:`default_executor`, ``$WMRL_SANDBOX`` and the CLIs' ``--backend``.
BACKENDS = tuple(_BACKENDS)


def default_executor(backend: str | None = None, **kwargs) -> Executor:
    """The executor to use when the caller has no preference.

    Args:
        backend: ``"local"``, ``"docker"`` or ``"ray"``; ``None`` reads ``$WMRL_SANDBOX`` (default ``local``).
        **kwargs: passed to the backend's constructor.
    """
    name = backend or os.environ.get("WMRL_SANDBOX", "local")
    if name not in _BACKENDS:
        raise ValueError(
            f"unknown sandbox backend {name!r} (from {'argument' if backend else '$WMRL_SANDBOX'}); "
            f"choose one of {sorted(_BACKENDS)}"
        )
    return _BACKENDS[name](**kwargs)
