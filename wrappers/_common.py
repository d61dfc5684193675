"""Plumbing shared by the wrappers: finding a wrapper in a stack, per-sub-env vector infos,
and which sub-envs a vector step really stepped or restarted (autoreset modes).

Private module: :func:`find_optional`, :func:`find_wrapper`, :class:`VectorSteps`, :func:`sub_info`, :func:`put_info`,
:func:`json_key`.
"""

from __future__ import annotations

from typing import Any, Hashable, Iterable, TypeVar

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

__all__ = ["find_optional", "find_wrapper", "VectorSteps", "sub_info", "put_info", "json_key", "INFO_DTYPES"]

W = TypeVar("W")

#: dtypes of the info arrays the vector wrappers add (object where ``None`` is possible).
INFO_DTYPES: dict[str, Any] = {
    "anchor": np.bool_,
    "anchor_weight": np.float64,
    "real_executions": np.int64,
    "wm_predictions": np.int64,
    "real_seconds": np.float64,
    "wm_seconds": np.float64,
    "anchor_fraction": object,
    "calibrated": np.bool_,
    "anchor_pairs_total": np.int64,
}


def find_optional(env: Any, cls: type[W]) -> W | None:
    """The outermost wrapper of type ``cls`` in ``env``'s stack (``env`` itself included), or ``None``."""
    current = env
    while current is not None and not isinstance(current, cls):
        current = getattr(current, "env", None)
    return current


def find_wrapper(env: Any, cls: type[W], *, needed_by: str) -> W:
    """Like :func:`find_optional`, but a missing wrapper is an error naming who needed it."""
    found = find_optional(env, cls)
    if found is None:
        raise TypeError(f"{needed_by} needs a {cls.__name__} below it in the wrapper stack, got {env!r}")
    return found


def json_key(gid: Any) -> Hashable:
    """A group id read back from JSON: lists (JSON's tuples) become tuples again, so they hash."""
    return tuple(json_key(x) for x in gid) if isinstance(gid, list) else gid


def sub_info(infos: dict[str, Any], i: int, keys: Iterable[str] | None = None) -> dict[str, Any]:
    """Sub-env ``i``'s entries of a vector ``info`` dict (nested dicts included), or only ``keys``."""
    out: dict[str, Any] = {}
    for key in infos if keys is None else (k for k in keys if k in infos):
        value = infos[key]
        if key.startswith("_"):
            continue
        mask = infos.get(f"_{key}")
        if isinstance(value, dict):
            if mask is None or mask[i]:
                out[key] = sub_info(value, i)
        elif mask is None or mask[i]:
            out[key] = value[i]
    return out


def put_info(infos: dict[str, Any], num_envs: int, i: int, values: dict[str, Any]) -> None:
    """Set sub-env ``i``'s ``values`` in a vector ``info`` dict, with ``_key`` masks."""
    for key, value in values.items():
        if key not in infos:
            infos[key] = np.zeros(num_envs, dtype=INFO_DTYPES.get(key, object))
            if infos[key].dtype == object:
                infos[key][:] = None
            infos[f"_{key}"] = np.zeros(num_envs, dtype=np.bool_)
        infos[key][i] = value
        infos[f"_{key}"][i] = True


class VectorSteps:
    """Tracks, for a vector env, which sub-envs a ``step`` call really steps and which start
    a new episode, under the env's autoreset mode (next-step, same-step or disabled)."""

    def __init__(self, env: VectorEnv) -> None:
        self.num_envs = env.num_envs
        self.mode = AutoresetMode(env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP))
        self._done = np.zeros(self.num_envs, dtype=np.bool_)

    def on_reset(self, mask: np.ndarray | None) -> np.ndarray:
        """Record a ``reset``; returns the mask of sub-envs it reset."""
        reset = np.ones(self.num_envs, dtype=np.bool_) if mask is None else np.asarray(mask, dtype=np.bool_)
        self._done[reset] = False
        return reset

    def stepped(self) -> np.ndarray:
        """Sub-envs the next ``step`` will step (the others autoreset instead)."""
        if self.mode == AutoresetMode.NEXT_STEP:
            return ~self._done
        return np.ones(self.num_envs, dtype=np.bool_)

    def on_step(self, stepped: np.ndarray, terminated: np.ndarray, truncated: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Record a ``step``; returns ``(ended, restarted)``: episodes that ended in it, and
        sub-envs that began a new episode by autoreset in it."""
        ended = stepped & (np.asarray(terminated) | np.asarray(truncated))
        if self.mode == AutoresetMode.NEXT_STEP:
            restarted = ~stepped
        elif self.mode == AutoresetMode.SAME_STEP:
            restarted = ended.copy()
        else:
            restarted = np.zeros(self.num_envs, dtype=np.bool_)
        self._done = ended.copy()
        return ended, restarted

    def step_info_target(self, infos: dict[str, Any], ended: np.ndarray, i: int) -> dict[str, Any]:
        """Where sub-env ``i``'s info about the step itself lives: ``final_info`` for an
        episode that ended under same-step autoreset (the top level holds the new episode's
        reset info), else the top level."""
        if self.mode == AutoresetMode.SAME_STEP and ended[i]:
            return infos.setdefault("final_info", {})
        return infos
