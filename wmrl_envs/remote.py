"""``wmrl/Remote-v0``: a Gymnasium env whose episodes run on a ``wmrl-serve`` server.

The env holds one OpenEnv WebSocket session (``/ws``) for its lifetime; ``reset`` / ``step``
are one message each, so the server-side stack (``real`` | ``wm`` | ``wmrl``) grades every
action, and many remote envs -- in one process or many -- share the server's one anchor
scheduler and calibrator (a GRPO group may span them: pass the same ``group_id`` in
``reset(options=...)``). Spaces come from the server (``/spaces``); ``info`` arrives as the
server's stack wrote it (unknown values absent) with its :class:`~wmrl_envs.outcome.Outcome`
values rebuilt, so code that runs against the in-process stack runs unchanged.

>>> import gymnasium as gym
>>> env = gym.make("wmrl/Remote-v0", url="http://127.0.0.1:8000")  # doctest: +SKIP
>>> obs, info = env.reset(options={"group_id": "g0", "group_size": 4})  # doctest: +SKIP
>>> obs, reward, terminated, truncated, info = env.step("```python\\nprint(1)\\n```")  # doctest: +SKIP

A server answers a bad request with an error, which this env raises as ``ValueError`` (bad
action / options) or ``ConnectionError`` (server gone).

Classes: :class:`RemoteEnv`. Functions: :func:`register_envs`.
"""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import Hashable, Iterable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from wmrl_envs.wire import info_from_json, space_from_json, to_json, value_from_json

__all__ = ["RemoteEnv", "register_envs", "ENV_ID"]

ENV_ID = "wmrl/Remote-v0"

#: Reset options that travel as the session's own reset fields (the others as ``options``).
_RESET_FIELDS = ("group_id", "group_size", "task")


def _http(url: str, body: Any = None, timeout: float = 60.0) -> Any:
    """GET (``body is None``) or POST JSON; a 4xx answer raises ``ValueError`` with its detail."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as err:
        raise ValueError(f"{url}: {err.code} {err.read().decode(errors='replace')}") from None
    except urllib.error.URLError as err:
        raise ConnectionError(f"no wmrl-serve server at {url}: {err.reason}") from None


class RemoteEnv(gym.Env):
    """A Gymnasium env served by ``wmrl-serve`` (see the module docstring).

    Args:
        url: the server's base URL, e.g. ``http://127.0.0.1:8000``.
        timeout_s: longest wait for one reset / step answer (a real execution may take minutes).
    """

    metadata = {"render_modes": []}

    def __init__(self, url: str, *, timeout_s: float = 600.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = float(timeout_s)
        described = _http(f"{self.url}/spaces", timeout=timeout_s)
        self.action_space = space_from_json(described["action"])
        self.observation_space = space_from_json(described["observation"])
        self.stack_kind: str = described.get("stack", "")
        self._ws: Any = None
        self._stack = contextlib.ExitStack()

    # -- the session -------------------------------------------------------------------------
    def _session(self) -> Any:
        if self._ws is None:
            from websockets.sync.client import connect

            ws_url = self.url.replace("https://", "wss://").replace("http://", "ws://") + "/ws"
            try:  # held open by an exit stack: websockets wants its connections used as contexts
                self._stack = contextlib.ExitStack()
                self._ws = self._stack.enter_context(
                    connect(ws_url, max_size=None, open_timeout=self.timeout_s, proxy=None)
                )
            except OSError as err:
                raise ConnectionError(f"no wmrl-serve server at {ws_url}: {err}") from None
        return self._ws

    def _call(self, kind: str, data: dict[str, Any]) -> dict[str, Any]:
        from websockets.exceptions import ConnectionClosed

        ws = self._session()
        try:
            ws.send(json.dumps({"type": kind, "data": data}))
            answer = json.loads(ws.recv(timeout=self.timeout_s))
        except (ConnectionClosed, TimeoutError) as err:
            self._drop()
            raise ConnectionError(f"wmrl-serve session at {self.url} lost during {kind}: {err}") from None
        if answer.get("type") == "error":
            raise ValueError(f"wmrl-serve refused the {kind}: {answer['data'].get('message', answer['data'])}")
        return answer["data"]

    def _unpack(self, data: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        body = data["observation"]
        return value_from_json(self.observation_space, body["observation"]), info_from_json(body.get("info", {}))

    # -- gymnasium API -----------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        options = dict(options or {})
        data: dict[str, Any] = {k: options.pop(k) for k in _RESET_FIELDS if options.get(k) is not None}
        if seed is not None:
            data["seed"] = int(seed)
        if options:
            data["options"] = to_json(options)
        return self._unpack(self._call("reset", data))

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        if isinstance(self.action_space, spaces.Text):
            payload: dict[str, Any] = {"text": str(action)}
        else:
            payload = {"values": to_json(np.asarray(action, dtype=float).ravel())}
        data = self._call("step", payload)
        obs, info = self._unpack(data)
        body = data["observation"]
        reward = data.get("reward")
        return obs, float(reward or 0.0), bool(body["terminated"]), bool(body["truncated"]), info

    def close(self) -> None:
        if self._ws is not None:
            try:
                self._ws.send(json.dumps({"type": "close", "data": {}}))
            except Exception:  # the server may be gone already; closing must not raise
                pass
            self._drop()
        super().close()

    def _drop(self) -> None:
        try:
            self._stack.close()
        except Exception:  # a connection already broken
            pass
        self._ws = None

    # -- the server's shared stack -----------------------------------------------------------
    def begin_step(self, group_ids: Iterable[Hashable]) -> frozenset:
        """Announce a training step's groups to the server (its calibration step boundary);
        returns the anchor groups among them."""
        return frozenset(_http(f"{self.url}/begin_step", {"group_ids": list(group_ids)}, self.timeout_s)["anchors"])

    def metrics(self) -> dict[str, Any]:
        """The server's ``/metrics``: anchor share, pairs, map state, exploitation gap, counters."""
        return dict(_http(f"{self.url}/metrics", timeout=self.timeout_s))


def register_envs() -> None:
    """Register ``wmrl/Remote-v0`` (idempotent)."""
    if ENV_ID not in gym.registry:
        gym.register(id=ENV_ID, entry_point="wmrl_envs.remote:RemoteEnv", disable_env_checker=True)
