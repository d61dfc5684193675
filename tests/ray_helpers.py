"""Shared fixtures of the Ray tests (imported by tests/test_ray*.py).

Fixtures: ``ray_instance`` (one real local Ray instance, 2 CPUs, for the whole session;
skipped with a reason only when the ``ray`` package is absent).
Helpers: :func:`ray_task_pids` (host pids of Ray workers running a given task),
:func:`descendants` (a process's descendants, from ``/proc``).
"""

from __future__ import annotations

import os

import pytest

from wmrl_envs.ray_cluster import ray_available

__all__ = ["ray_instance", "ray_task_pids", "descendants"]


@pytest.fixture(scope="session")
def ray_instance():
    """A real local Ray instance (2 CPUs) shared by the session's Ray tests."""
    if not ray_available():
        pytest.skip("the `ray` package is not installed (pip install 'wmrl-envs[ray]'); Ray backends not tested")
    from wmrl_envs.ray_cluster import ensure_ray

    ray = ensure_ray(num_cpus=2)
    yield ray
    ray.shutdown()


def ray_task_pids(task_name: str) -> list[int]:
    """Pids of Ray worker processes currently executing ``task_name`` (their title is ``ray::<name>``)."""
    want = f"ray::{task_name}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                title = f.read().split(b"\0")[0].strip()
        except OSError:
            continue
        if title == want:
            pids.append(int(entry))
    return pids


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children first), read from ``/proc/*/stat``."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    out, frontier = [], [pid]
    while frontier:
        kids = [p for p, pp in parents.items() if pp in frontier]
        out.extend(kids)
        frontier = kids
    return out
