"""Joining or starting the Ray instance that the scale-out backends share.

:func:`ensure_ray` is the one place the suite calls ``ray.init``: the sandbox's
:class:`~wmrl_envs.sandbox.ray_executor.RayExecutor` and the rollout vector env
:class:`~wmrl_envs.ray_vector.RayVectorEnv` both go through it, so a process that uses
both talks to one Ray instance.

* ``address`` given (``"auto"``, ``"10.0.0.5:6379"``, ``"ray://head:10001"``): join that
  cluster; its own resources apply.
* no ``address`` and ``$RAY_ADDRESS`` set: join that cluster (Ray's own convention).
* neither: start a local instance with ``num_cpus`` CPUs (default: all of this machine's).
  Its address is then exported as ``$RAY_ADDRESS`` so that subprocesses started afterwards
  (an ``AsyncVectorEnv``'s workers) join this instance instead of starting their own.

If Ray is already initialised in this process, that instance is used as it is.

To run on a cluster: ``ray start --head`` on one machine, ``ray start --address=HEAD:6379``
on the others (each with this package installed: the tasks import it), then
``WMRL_SANDBOX=ray RAY_ADDRESS=HEAD:6379 <any command>`` or ``RayExecutor(address="auto")``.

Functions: :func:`ensure_ray`, :func:`ray_available`, :func:`cluster_cpus`.

>>> ray_available() in (True, False)
True
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
from typing import Any

__all__ = ["ensure_ray", "ray_available", "cluster_cpus"]

log = logging.getLogger(__name__)

_lock = threading.Lock()
_exported_address: str | None = None  # the RAY_ADDRESS this module set for a local instance


def ray_available() -> bool:
    """True if the ``ray`` package is installed (the ``ray`` extra)."""
    return importlib.util.find_spec("ray") is not None


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError("Ray backends need the `ray` package: pip install 'wmrl-envs[ray]'") from e
    return ray


def ensure_ray(address: str | None = None, *, num_cpus: int | None = None, **init_kwargs: Any) -> Any:
    """The ``ray`` module, initialised (see the module docstring for which instance).

    Args:
        address: cluster to join; ``None``: ``$RAY_ADDRESS``, else a new local instance.
        num_cpus: CPUs of a new local instance (ignored when joining a cluster).
        init_kwargs: more ``ray.init`` arguments (``runtime_env=`` to ship code to a
            cluster whose nodes lack this package, ``namespace=``, ...).
    """
    global _exported_address
    ray = _import_ray()
    with _lock:
        if ray.is_initialized():
            return ray
        env_address = os.environ.get("RAY_ADDRESS")
        if env_address and env_address == _exported_address:
            # our own earlier local instance, shut down since: start a fresh one
            del os.environ["RAY_ADDRESS"]
            env_address = None
        kwargs: dict[str, Any] = {"log_to_driver": False, **init_kwargs}
        target = address or env_address
        if target:
            ray.init(address=target, **kwargs)
            log.info("joined the Ray cluster at %s", target)
            return ray
        kwargs.setdefault("include_dashboard", False)
        context = _init_local(ray, num_cpus=num_cpus, **kwargs)
        gcs = context.address_info.get("gcs_address")
        if gcs:
            os.environ["RAY_ADDRESS"] = _exported_address = gcs
        log.info("started a local Ray instance (%s CPUs) at %s", num_cpus or "all", gcs)
        return ray


def _init_local(ray: Any, **kwargs: Any) -> Any:
    """``ray.init`` of a new local instance from a thread that lives as long as the process.

    Ray starts its GCS and raylet with ``PR_SET_PDEATHSIG``, which fires when the *thread*
    that forked them exits: started from a pool thread (a grading thread calling
    ``RayExecutor.run`` first), the instance would die with that thread. The main thread,
    or a daemon keeper thread that never returns, keeps it alive."""
    if threading.current_thread() is threading.main_thread():
        return _init_retrying(ray, kwargs)
    box: dict[str, Any] = {}
    ready = threading.Event()

    def keeper() -> None:
        try:
            box["context"] = _init_retrying(ray, kwargs)
        except BaseException as e:  # handed to the caller
            box["error"] = e
        finally:
            ready.set()
        if "context" in box:
            _keep_alive.wait()  # forever: the instance's processes are tied to this thread

    threading.Thread(target=keeper, name="wmrl-ray-keeper", daemon=True).start()
    ready.wait()
    if "error" in box:
        raise box["error"]
    return box["context"]


_keep_alive = threading.Event()  # never set


def _init_retrying(ray: Any, kwargs: dict[str, Any], attempts: int = 3) -> Any:
    """``ray.init``, tried again when a starved machine lets the node's start-up time out."""
    for attempt in range(1, attempts + 1):
        try:
            return ray.init(**kwargs)
        except Exception as e:  # Ray raises a bare Exception for a node start-up timeout
            if "timed out during startup" not in str(e) or attempt == attempts:
                raise
            log.warning("Ray node start-up timed out (attempt %d/%d); retrying", attempt, attempts)
            ray.shutdown()
    raise AssertionError("unreachable")


def cluster_cpus() -> float:
    """CPUs the initialised Ray instance offers in total (all nodes)."""
    return float(_import_ray().cluster_resources().get("CPU", 0.0))
