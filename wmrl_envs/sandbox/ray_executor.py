"""Sandbox runs as Ray tasks: the :class:`~wmrl_envs.sandbox.base.Executor` protocol on a cluster.

Each :meth:`RayExecutor.run` is one Ray task (``num_cpus`` per run) that runs the script
with an ordinary :class:`~wmrl_envs.sandbox.local.LocalExecutor` (or
:class:`~wmrl_envs.sandbox.docker_backend.DockerExecutor`) *on the node the task lands
on*, so every node applies the same isolation, and returns that backend's
:class:`~wmrl_envs.sandbox.base.ExecutionResult` unchanged: the same script gives the
same result as the local backend.

Inputs are host paths on the caller's machine, which other nodes cannot see: they are read
once, put in Ray's object store (cached by path, size and mtime) and written to a staging
directory on the worker (cached by content digest), which the inner backend then copies
into the run's work dir as usual.

Failures are kept apart:

* the **solution's** failures (errors, timeouts, limits) are results, never retried;
* the **caller's** errors (a bad input path, bad limits, a backend unavailable on the
  node) are raised again in the caller, unchanged, never retried;
* the **harness's** failures (the Ray worker or node died mid-run, the object store lost
  the task, a ``result_timeout`` passed) are retried up to ``max_retries`` times, each
  one logged as a warning and counted in :attr:`RayExecutor.stats`; when every attempt
  is lost, :class:`SandboxHarnessError` is raised (graders turn that into an unknown
  outcome, never a score).

``WMRL_SANDBOX=ray`` selects this backend in :func:`~wmrl_envs.sandbox.default_executor`
and so in every CLI; ``WMRL_RAY_INNER`` picks the backend on the nodes (``local``
default, or ``docker``) and ``RAY_ADDRESS`` the cluster (no address: a local Ray
instance is started, see :mod:`wmrl_envs.ray_cluster`).

Example (starts a local Ray instance, ~10-20 s on 2 busy cores, so not run as a doctest)::

    from wmrl_envs.sandbox import Job, Limits
    from wmrl_envs.sandbox.ray_executor import RayExecutor

    ex = RayExecutor(num_cpus=1, max_concurrent=4)            # or address="auto" on a cluster
    ex.run("print(6 * 7)", limits=Limits(wall_seconds=10)).stdout_tail    # '42\\n'
    [r.status for r in ex.map([Job("print(1)"), Job("raise SystemExit(3)")])]  # ['ok', 'error']
    ex.stats.as_dict()   # {'runs': 3, 'attempts': 3, 'harness_retries': 0, 'harness_failures': 0}

Classes: :class:`RayExecutor`, :class:`RayExecutorStats`, :class:`SandboxHarnessError`.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import hashlib
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from wmrl_envs.sandbox.base import ExecutionResult, Job, Limits, SandboxUnavailable, resolve_limits

__all__ = ["RayExecutor", "RayExecutorStats", "SandboxHarnessError", "INNER_BACKENDS", "TASK_NAME"]

log = logging.getLogger(__name__)

#: Backends a :class:`RayExecutor` can run on its nodes.
INNER_BACKENDS = ("local", "docker")

#: Name of the Ray task of one run (worker processes show ``ray::<TASK_NAME>`` while running one).
TASK_NAME = "wmrl_sandbox_run"

# A packed input: ("file", content) or ("dir", [(relative path, content or None for a directory)]).
_Packed = tuple[str, Any]


class SandboxHarnessError(RuntimeError):
    """Every attempt of a sandbox run was lost to the harness (worker/node death, lost task)."""


@dataclasses.dataclass
class RayExecutorStats:
    """Counters of one :class:`RayExecutor` (thread-safe updates through :meth:`add`).

    Attributes:
        runs: ``run`` calls that returned a result.
        attempts: Ray tasks submitted (``runs`` + retries + lost runs' attempts).
        harness_retries: attempts lost to the harness and submitted again.
        harness_failures: runs that raised :class:`SandboxHarnessError` (every attempt lost).
    """

    runs: int = 0
    attempts: int = 0
    harness_retries: int = 0
    harness_failures: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def add(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def __getstate__(self) -> dict[str, int]:
        return self.as_dict()

    def __setstate__(self, state: dict[str, int]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


# ------------------------------------------------------------------------ driver side
def _pack(src: Path) -> tuple[_Packed, str]:
    """``(packed, digest)`` of a host file or directory (links followed, as the backends copy)."""
    h = hashlib.sha256()
    if src.is_dir():
        entries: list[tuple[str, bytes | None]] = []
        for dirpath, dirnames, filenames in os.walk(src, followlinks=True):
            dirnames.sort()
            rel_dir = os.path.relpath(dirpath, src)
            if rel_dir != ".":
                entries.append((rel_dir, None))
                h.update(b"d" + rel_dir.encode() + b"\0")
            for name in sorted(filenames):
                rel = os.path.normpath(os.path.join(rel_dir, name))
                data = Path(dirpath, name).read_bytes()
                entries.append((rel, data))
                h.update(b"f" + rel.encode() + b"\0" + hashlib.sha256(data).digest())
        return ("dir", entries), "d" + h.hexdigest()
    data = src.read_bytes()
    h.update(data)
    return ("file", data), "f" + h.hexdigest()


def _stamp(src: Path) -> tuple[Any, ...]:
    """What identifies a host input's current content cheaply (path, sizes, mtimes)."""
    st = src.stat()
    if not src.is_dir():
        return (str(src), st.st_size, st.st_mtime_ns)
    parts: list[Any] = [str(src)]
    for dirpath, dirnames, filenames in os.walk(src, followlinks=True):
        dirnames.sort()
        for name in sorted(filenames):
            s = os.stat(os.path.join(dirpath, name))
            parts.append((dirpath, name, s.st_size, s.st_mtime_ns))
    return tuple(parts)


class _InputStore:
    """Host inputs put in Ray's object store once per content version (LRU of ``capacity``)."""

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = capacity
        self._refs: collections.OrderedDict[tuple[Any, ...], tuple[Any, str]] = collections.OrderedDict()
        self._lock = threading.Lock()

    def put(self, ray: Any, inputs: Mapping[str, str | os.PathLike] | None) -> tuple[list[tuple[str, str]], list[Any]]:
        """``([(relative path, digest)], [object ref per input])``; raises like the backends on a missing input."""
        keys: list[tuple[str, str]] = []
        refs: list[Any] = []
        for rel, host in (inputs or {}).items():
            src = Path(host)
            if not src.exists():
                raise FileNotFoundError(f"input {rel!r}: host path {str(src)!r} does not exist")
            stamp = _stamp(src)
            with self._lock:
                hit = self._refs.get(stamp)
                if hit is not None:
                    self._refs.move_to_end(stamp)
            if hit is None:
                packed, digest = _pack(src)
                hit = (ray.put(packed), digest)
                with self._lock:
                    self._refs[stamp] = hit
                    while len(self._refs) > self.capacity:
                        self._refs.popitem(last=False)
            keys.append((rel, hit[1]))
            refs.append(hit[0])
        return keys, refs


# ------------------------------------------------------------------------ worker side
_worker_executors: dict[str, Any] = {}
_stage_root: Path | None = None
_staged: collections.OrderedDict[str, Path] = collections.OrderedDict()
_STAGE_CAPACITY = 64


def _inner_executor(backend: str, kwargs: Mapping[str, Any]) -> Any:
    """This worker's backend instance (one per configuration, reused across tasks)."""
    key = f"{backend}:{sorted(kwargs.items())!r}"
    ex = _worker_executors.get(key)
    if ex is None:
        from wmrl_envs.sandbox.docker_backend import DockerExecutor
        from wmrl_envs.sandbox.local import LocalExecutor

        ex = _worker_executors[key] = {"local": LocalExecutor, "docker": DockerExecutor}[backend](**kwargs)
    return ex


def _cleanup_stage() -> None:
    if _stage_root is not None:
        shutil.rmtree(_stage_root, ignore_errors=True)


def _materialize(digest: str, packed: _Packed) -> Path:
    """A path on this node holding ``packed`` (written once per digest per worker)."""
    global _stage_root
    path = _staged.get(digest)
    if path is not None and path.exists():
        _staged.move_to_end(digest)
        return path
    if _stage_root is None:
        _stage_root = Path(tempfile.mkdtemp(prefix="wmrl-ray-inputs-"))
        atexit.register(_cleanup_stage)
    tmp = Path(tempfile.mkdtemp(dir=_stage_root))
    kind, payload = packed
    if kind == "file":
        path = tmp / "input"
        path.write_bytes(payload)
    else:
        path = tmp / "input"
        path.mkdir()
        for rel, data in payload:
            target = path / rel
            if data is None:
                target.mkdir(parents=True, exist_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
    _staged[digest] = path
    while len(_staged) > _STAGE_CAPACITY:
        _, old = _staged.popitem(last=False)
        shutil.rmtree(old.parent, ignore_errors=True)
    return path


def wmrl_sandbox_run(
    backend: str,
    backend_kwargs: Mapping[str, Any],
    script: str,
    outputs: Sequence[str],
    limits: Limits,
    keys: Sequence[tuple[str, str]],
    *packed_inputs: _Packed,
) -> tuple[str, Any]:
    """The Ray task body: ``("result", ExecutionResult)`` or ``("raise", exception)``.

    Exceptions are returned, not raised, so that the caller can tell its own errors
    (re-raised unchanged, never retried) from a harness failure (a Ray error, retried).
    """
    try:
        staged = {rel: str(_materialize(digest, packed)) for (rel, digest), packed in zip(keys, packed_inputs)}
        ex = _inner_executor(backend, backend_kwargs)
        return "result", ex.run(script, inputs=staged, outputs=outputs, limits=limits)
    except Exception as e:  # the caller's error or an unavailable backend: hand it back as is
        return "raise", e


_remote_lock = threading.Lock()
_remote_fn: Any = None


def _remote(ray: Any) -> Any:
    global _remote_fn
    with _remote_lock:
        if _remote_fn is None:
            _remote_fn = ray.remote(wmrl_sandbox_run)
        return _remote_fn


# ------------------------------------------------------------------------ the executor
class RayExecutor:
    """The :class:`~wmrl_envs.sandbox.base.Executor` protocol on Ray tasks (thread-safe).

    Args:
        backend: the backend each node runs the script with: ``"local"`` (bubblewrap +
            rlimits + non-root uid) or ``"docker"``; ``None`` reads ``$WMRL_RAY_INNER``
            (default ``local``).
        address: Ray cluster to join (``"auto"``, ``"HOST:6379"``, ``"ray://HOST:10001"``);
            ``None``: ``$RAY_ADDRESS``, else a local instance (see :mod:`wmrl_envs.ray_cluster`).
        num_cpus: CPUs each run reserves in Ray's scheduler (a node with ``C`` CPUs runs at
            most ``C / num_cpus`` at once).
        max_concurrent: most runs in flight from this executor at once (``None``: only Ray's
            resources limit it); extra ``run`` calls wait.
        max_retries: extra attempts for a run lost to the harness (never for the solution's
            own failure).
        result_timeout: seconds to wait for one attempt's result beyond the run's wall
            limit before it counts as lost (``None``: wait as long as it takes). Time spent
            queued for a free CPU counts, so leave room on a busy cluster.
        reserve_memory: reserve the run's ``Limits.memory_bytes`` in Ray's scheduler too.
        local_cpus: CPUs of a local Ray instance this executor starts (default: all).
        backend_kwargs: passed to the node's backend constructor (e.g. ``strict=True``).
        init_kwargs: passed to ``ray.init`` (e.g. ``runtime_env=``).
    """

    def __init__(
        self,
        backend: str | None = None,
        *,
        address: str | None = None,
        num_cpus: float = 1.0,
        max_concurrent: int | None = None,
        max_retries: int = 2,
        result_timeout: float | None = None,
        reserve_memory: bool = False,
        local_cpus: int | None = None,
        backend_kwargs: Mapping[str, Any] | None = None,
        init_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        backend = backend or os.environ.get("WMRL_RAY_INNER", "local")
        if backend not in INNER_BACKENDS:
            raise ValueError(f"RayExecutor backend must be one of {INNER_BACKENDS}, got {backend!r}")
        if isinstance(num_cpus, bool) or not isinstance(num_cpus, (int, float)) or num_cpus <= 0:
            raise ValueError(f"num_cpus must be a positive number, got {num_cpus!r}")
        if max_concurrent is not None and (
            isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) or max_concurrent < 1
        ):
            raise ValueError(f"max_concurrent must be an int >= 1 or None, got {max_concurrent!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be an int >= 0, got {max_retries!r}")
        if result_timeout is not None and not result_timeout > 0:
            raise ValueError(f"result_timeout must be positive or None, got {result_timeout!r}")
        self.inner = backend
        self.backend = backend  # what results report: the nodes' backend (results are that backend's)
        self.address = address
        self.num_cpus = float(num_cpus)
        self.max_concurrent = max_concurrent
        self.max_retries = max_retries
        self.result_timeout = result_timeout
        self.reserve_memory = reserve_memory
        self.local_cpus = local_cpus
        self.backend_kwargs = dict(backend_kwargs or {})
        self.init_kwargs = dict(init_kwargs or {})
        self.stats = RayExecutorStats()
        self._setup()

    def _setup(self) -> None:
        self._inputs = _InputStore()
        self._slots = threading.BoundedSemaphore(self.max_concurrent) if self.max_concurrent else None
        self._ray: Any = None
        self._ray_lock = threading.Lock()

    # picklable (an env holding one can go to an AsyncVectorEnv worker): locks and refs are rebuilt
    def __getstate__(self) -> dict[str, Any]:
        keep = ("_inputs", "_slots", "_ray", "_ray_lock")
        state = {k: v for k, v in self.__dict__.items() if k not in keep}
        state["stats"] = RayExecutorStats()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup()

    @property
    def ray(self) -> Any:
        """The initialised ``ray`` module (joins or starts the instance on first use)."""
        with self._ray_lock:
            if self._ray is None:
                from wmrl_envs.ray_cluster import ensure_ray

                self._ray = ensure_ray(self.address, num_cpus=self.local_cpus, **self.init_kwargs)
            return self._ray

    def run(
        self,
        script: str,
        *,
        inputs: Mapping[str, str | os.PathLike] | None = None,
        outputs: Sequence[str] = (),
        limits: Limits | None = None,
    ) -> ExecutionResult:
        """Run ``script`` on a Ray worker; the node's backend's result, unchanged."""
        limits = resolve_limits(limits)
        if not isinstance(script, str):
            raise TypeError(f"script must be a str of Python source, got {type(script).__name__}")
        if isinstance(outputs, str):
            raise TypeError(f"outputs must be a sequence of paths, got the string {outputs!r}")
        ray = self.ray
        keys, refs = self._inputs.put(ray, inputs)
        options: dict[str, Any] = {"num_cpus": self.num_cpus, "max_retries": 0, "retry_exceptions": False}
        if self.reserve_memory:
            options["memory"] = limits.memory_bytes
        timeout = None if self.result_timeout is None else limits.wall_seconds + self.result_timeout
        if self._slots is not None:
            self._slots.acquire()
        try:
            errors: list[str] = []
            for attempt in range(1, self.max_retries + 2):
                self.stats.add(attempts=1)
                ref = (
                    _remote(ray)
                    .options(**options)
                    .remote(self.inner, self.backend_kwargs, script, list(outputs), limits, keys, *refs)
                )
                try:
                    kind, value = ray.get(ref, timeout=timeout)
                except ray.exceptions.RayError as e:  # the harness, not the solution
                    if isinstance(e, ray.exceptions.GetTimeoutError):
                        ray.cancel(ref, force=True)
                    errors.append(f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}")
                    if attempt <= self.max_retries:
                        self.stats.add(harness_retries=1)
                        log.warning(
                            "sandbox run attempt %d/%d lost to the harness (%s); retrying",
                            attempt, self.max_retries + 1, errors[-1],
                        )  # fmt: skip
                        time.sleep(min(0.5 * attempt, 2.0))
                    continue
                if kind == "raise":
                    raise value
                self.stats.add(runs=1)
                return value
            self.stats.add(harness_failures=1)
            raise SandboxHarnessError(
                f"sandbox run lost to the harness on all {self.max_retries + 1} attempts: " + "; ".join(errors)
            )
        finally:
            if self._slots is not None:
                self._slots.release()

    def map(self, jobs: Sequence[Job], *, progress: bool = False) -> list[ExecutionResult]:
        """Run ``jobs`` concurrently (up to ``max_concurrent``, else the cluster's CPUs); results in order."""
        from wmrl_envs.ray_cluster import cluster_cpus
        from wmrl_envs.sandbox.pool import ExecutorPool

        jobs = list(jobs)
        if not jobs:
            return []
        _ = self.ray
        width = self.max_concurrent or max(1, int(cluster_cpus() // self.num_cpus))
        with ExecutorPool(self, max_concurrent=min(width, len(jobs)), progress=progress) as pool:
            return pool.map(jobs)

    def check(self) -> None:
        """Raise :class:`SandboxUnavailable` if the node backend cannot run here (one tiny run)."""
        r = self.run("pass", limits=Limits(wall_seconds=30))
        if not r.ok:
            raise SandboxUnavailable(f"a trivial run failed on the Ray workers: {r.status} {r.reason}")
