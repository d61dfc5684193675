"""JSON on the wire: Gymnasium spaces, observations, actions and ``info`` dicts of the suite.

Shared by the server (``wmrl-serve``, :mod:`wrappers.serving`) and the remote client
(:mod:`wmrl_envs.remote`) so both sides agree on one encoding:

* spaces: :func:`space_to_json` / :func:`space_from_json` for the spaces the suite uses
  (:class:`~wmrl_envs.spaces.FreeText`, ``Box``, ``Discrete``, ``Dict``);
* values: :func:`to_json` turns numpy arrays and scalars, tuples, dataclasses (an
  :class:`~wmrl_envs.outcome.Outcome`) into plain JSON; :func:`value_from_json` turns an
  observation or action back into what the space holds;
* ``info``: :func:`info_from_json` rebuilds the :class:`~wmrl_envs.outcome.Outcome` values
  (``outcome``, ``wm_outcome``, ..., and the episode's list ``outcomes``) so code reading
  ``info["outcome"].status`` runs unchanged.

Unknown values stay unknown: a key the server left out (the suite's info policy) is absent on
the client too; nothing is turned into 0.

>>> import numpy as np
>>> from gymnasium import spaces
>>> box = spaces.Box(-1.0, 1.0, (2,), np.float32)
>>> space_from_json(space_to_json(box)) == box
True
>>> value_from_json(box, to_json(np.array([0.5, -0.25], np.float32)))
array([ 0.5 , -0.25], dtype=float32)
>>> space_from_json(space_to_json(FreeText(100)))
FreeText(0, 100)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium import spaces

from wmrl_envs.outcome import Outcome
from wmrl_envs.spaces import FreeText

__all__ = [
    "space_to_json",
    "space_from_json",
    "to_json",
    "value_from_json",
    "info_from_json",
    "OUTCOME_KEYS",
    "OUTCOME_LIST_KEYS",
]

#: Info keys whose values are :class:`~wmrl_envs.outcome.Outcome` s.
OUTCOME_KEYS = ("outcome", "wm_outcome", "real_outcome", "env_outcome")
#: Info keys whose values are lists of :class:`~wmrl_envs.outcome.Outcome` s (an episode's, at its end).
OUTCOME_LIST_KEYS = ("outcomes",)


def space_to_json(space: spaces.Space) -> dict[str, Any]:
    """A JSON description of ``space`` (raises ``TypeError`` for a kind the suite does not use)."""
    if isinstance(space, spaces.Text):
        return {"type": "text", "min_length": space.min_length, "max_length": space.max_length}
    if isinstance(space, spaces.Box):
        return {
            "type": "box",
            "low": space.low.tolist(),
            "high": space.high.tolist(),
            "shape": list(space.shape),
            "dtype": str(space.dtype),
        }
    if isinstance(space, spaces.Discrete):
        return {"type": "discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.Dict):
        return {"type": "dict", "spaces": {k: space_to_json(s) for k, s in space.spaces.items()}}
    raise TypeError(f"no wire encoding for {type(space).__name__} spaces")


def space_from_json(d: Mapping[str, Any]) -> spaces.Space:
    """The space :func:`space_to_json` described (text spaces come back as :class:`FreeText`)."""
    kind = d.get("type")
    if kind == "text":
        return FreeText(int(d["max_length"]), min_length=int(d.get("min_length", 0)))
    if kind == "box":
        dtype = np.dtype(d["dtype"])
        return spaces.Box(np.array(d["low"], dtype), np.array(d["high"], dtype), tuple(d["shape"]), dtype)
    if kind == "discrete":
        return spaces.Discrete(int(d["n"]), start=int(d.get("start", 0)))
    if kind == "dict":
        return spaces.Dict({k: space_from_json(s) for k, s in d["spaces"].items()})
    raise ValueError(f"unknown space description {kind!r}")


def to_json(value: Any) -> Any:
    """``value`` as plain JSON (numpy -> lists / scalars, dataclasses -> dicts, tuples -> lists);
    a NaN or infinite float becomes ``None`` (JSON has neither)."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, np.ndarray):
        return to_json(value.tolist())
    if isinstance(value, np.generic):
        return to_json(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_json(v) for v in value]
    return str(value)


def value_from_json(space: spaces.Space, value: Any) -> Any:
    """An observation or action decoded for ``space`` (arrays get the space's dtype and shape)."""
    if isinstance(space, spaces.Box):
        return np.asarray(value, dtype=space.dtype).reshape(space.shape)
    if isinstance(space, spaces.Discrete):
        return np.int64(value)
    if isinstance(space, spaces.Dict):
        return {k: value_from_json(s, value[k]) for k, s in space.spaces.items()}
    return value


def info_from_json(info: Mapping[str, Any]) -> dict[str, Any]:
    """An ``info`` dict from the wire, with its outcomes rebuilt as :class:`Outcome` s and its
    anchor pairs as tuples."""
    out = dict(info)
    for key in OUTCOME_KEYS:
        if isinstance(out.get(key), Mapping):
            out[key] = Outcome(**out[key])
    for key in OUTCOME_LIST_KEYS:
        if isinstance(out.get(key), list):
            out[key] = [Outcome(**o) if isinstance(o, Mapping) else o for o in out[key]]
    if isinstance(out.get("anchor_pairs"), list):
        out["anchor_pairs"] = [tuple(p) for p in out["anchor_pairs"]]
    return out
