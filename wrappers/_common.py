"""Plumbing shared by the wrappers: finding a wrapper in a stack, per-sub-env vector infos
under the suite's info policy (:mod:`wmrl_envs.vector`: unknown values are left out, each
key has one type), and which sub-envs a vector step really stepped or restarted.

Private module (``find_layer`` / ``require_layer`` are re-exported by ``wrappers``):
:func:`find_layer`, :func:`require_layer`, :class:`VectorSteps`, :func:`put_info`, :func:`json_key`;
re-exported from :mod:`wmrl_envs.vector`: :func:`known_info`, :func:`sub_info`.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, TypeVar, cast

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from wmrl_envs.vector import known_info, sub_info

__all__ = [
    "find_layer",
    "require_layer",
    "VectorSteps",
    "sub_info",
    "known_info",
    "put_info",
    "json_key",
    "INFO_DTYPES",
]

W = TypeVar("W")

#: dtypes of the info arrays the vector wrappers add; keys not listed hold objects.
INFO_DTYPES: dict[str, Any] = {
    "anchor": np.bool_,
    "anchor_weight": np.float64,
    "real_executions": np.int64,
    "wm_predictions": np.int64,
    "real_seconds": np.float64,
    "wm_seconds": np.float64,
    "wm_score": np.float64,
    "calibrated_score": np.float64,
    "true_score": np.float64,
    "anchor_fraction": np.float64,
    "calibrated": np.bool_,
    "anchor_pairs_total": np.int64,
}


def find_layer(env: Any, cls: type[W] | tuple[type, ...]) -> W | None:
    """The outermost wrapper of type ``cls`` in ``env``'s stack (``env`` itself included), or
    ``None``. Pass a tuple to accept either form, e.g. ``(AnchorWrapper, VectorAnchorWrapper)``."""
    current = env
    while current is not None and not isinstance(current, cls):
        current = getattr(current, "env", None)
    return cast("W | None", current)


def require_layer(env: Any, cls: type[W], *, needed_by: str) -> W:
    """Like :func:`find_layer`, but a missing wrapper is an error naming who needed it."""
    found = find_layer(env, cls)
    if found is None:
        raise TypeError(f"{needed_by} needs a {cls.__name__} below it in the wrapper stack, got {env!r}")
    return found


def json_key(gid: Any) -> Hashable:
    """A group id read back from JSON: lists (JSON's tuples) become tuples again, so they hash."""
    return tuple(json_key(x) for x in gid) if isinstance(gid, list) else gid


def put_info(infos: dict[str, Any], num_envs: int, i: int, values: dict[str, Any]) -> None:
    """Set sub-env ``i``'s known ``values`` in a vector ``info`` dict, with ``_key`` masks
    (a ``None`` value is unknown: left out, its mask stays False)."""
    for key, value in values.items():
        if value is None:
            continue
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

    def on_step(
        self, stepped: np.ndarray, terminated: np.ndarray, truncated: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
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
