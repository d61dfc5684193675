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

:class:`RemoteVectorEnv` holds ``num_envs`` such sessions as one ``VectorEnv`` whose sub-envs
step concurrently (the server batches their world-model predictions): the project's GRPO
trainer (``python -m agents.llm train --remote URL``) rolls out through it unchanged. Its
autoreset is next-step, with one difference that keeps the server's anchor book clean: an
ended sub-env opens no server episode until the caller resets it (see the class).

Classes: :class:`RemoteEnv`, :class:`RemoteVectorEnv`. Functions: :func:`register_envs`.
"""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import Hashable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from wmrl_envs.wire import info_from_json, space_from_json, to_json, value_from_json

__all__ = ["RemoteEnv", "RemoteVectorEnv", "describe_server", "register_envs", "ENV_ID"]

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


def describe_server(url: str, timeout: float = 30.0) -> dict[str, Any]:
    """The server's ``/spaces``: its env's spaces, ``stack`` kind and ``max_action_chars``
    (``ConnectionError`` when nothing answers, ``ValueError`` on a 4xx answer)."""
    return dict(_http(f"{url.rstrip('/')}/spaces", timeout=timeout))


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
        described = describe_server(self.url, timeout_s)
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


class RemoteVectorEnv(VectorEnv):
    """``num_envs`` sessions of one ``wmrl-serve`` server as a ``VectorEnv``.

    Every sub-env is a :class:`RemoteEnv` (its own WebSocket session); ``reset`` and ``step``
    send the sub-envs' messages from a thread each, so the server steps them concurrently.
    ``reset(options={..., "reset_mask": mask})`` resets only the masked sub-envs, all with the
    same options (the GRPO rollout resets one group's members together this way).

    Autoreset is :attr:`~gymnasium.vector.AutoresetMode.NEXT_STEP` for the caller -- the step
    after a sub-env's episode ended returns reward 0 and ``terminated = truncated = False`` --
    except that the server is not asked to open an episode then: the sub-env stays idle (its
    steps send nothing and return its last observation and an empty info) until the caller
    resets it. A server-side episode is a member of an anchor group; one opened by an autoreset
    nobody asked for would join an automatic group of the server's anchor scheduler (counted in
    its anchor share, abandoned with unknown scores at the next reset).

    Args:
        url: the server's base URL.
        num_envs: sessions (>= 1).
        timeout_s: longest wait for one reset / step answer.

    The server-side stack is reached through :meth:`begin_step` and :meth:`metrics` (what
    :class:`~wrappers.StackHandle` uses).
    """

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, url: str, num_envs: int, *, timeout_s: float = 600.0) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.envs = [RemoteEnv(url, timeout_s=timeout_s) for _ in range(num_envs)]
        first = self.envs[0]
        self.url, self.num_envs, self.stack_kind = first.url, num_envs, first.stack_kind
        self.single_action_space = first.action_space
        self.single_observation_space = first.observation_space
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self._obs: list[Any] = [None] * num_envs
        self._observations: Any = create_empty_array(self.single_observation_space, n=num_envs, fn=np.zeros)
        self._ended = np.zeros(num_envs, dtype=np.bool_)  # episode over, no server episode open
        self._pool = ThreadPoolExecutor(max_workers=num_envs, thread_name_prefix="wmrl-remote")

    def _batch(self) -> Any:
        self._observations = concatenate(self.single_observation_space, self._obs, self._observations)
        return self._observations

    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        options = dict(options or {})
        mask = options.pop("reset_mask", None)
        which = list(range(self.num_envs)) if mask is None else [i for i in range(self.num_envs) if mask[i]]
        if not which:
            raise ValueError("reset_mask selects no sub-env")
        seeds: list[int | None] = (
            [None] * self.num_envs
            if seed is None
            else [seed + i for i in range(self.num_envs)]
            if isinstance(seed, int)
            else list(seed)
        )
        if len(seeds) != self.num_envs:
            raise ValueError(f"{len(seeds)} seeds for {self.num_envs} sub-envs")
        results = list(self._pool.map(lambda i: self.envs[i].reset(seed=seeds[i], options=options or None), which))
        infos: dict[str, Any] = {}
        for i, (obs, info) in zip(which, results):
            self._obs[i] = obs
            self._ended[i] = False
            infos = self._add_info(infos, info, i)
        return self._batch(), infos

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        actions = list(iterate(self.action_space, actions))
        live = [i for i in range(self.num_envs) if not self._ended[i]]
        results = list(self._pool.map(lambda i: self.envs[i].step(actions[i]), live))
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminated = np.zeros(self.num_envs, dtype=np.bool_)
        truncated = np.zeros(self.num_envs, dtype=np.bool_)
        infos: dict[str, Any] = {}
        for i, (obs, reward, term, trunc, info) in zip(live, results):
            self._obs[i], rewards[i], terminated[i], truncated[i] = obs, reward, term, trunc
            infos = self._add_info(infos, info, i)
        self._ended[live] = terminated[live] | truncated[live]
        return self._batch(), rewards, terminated, truncated, infos

    def close_extras(self, **kwargs: Any) -> None:
        for env in self.envs:
            env.close()
        self._pool.shutdown(wait=True)

    # -- the server's shared stack (as RemoteEnv's) -------------------------------------------
    def begin_step(self, group_ids: Iterable[Hashable]) -> frozenset:
        """Announce a training step's groups to the server; returns the anchor groups among them."""
        return self.envs[0].begin_step(group_ids)

    def metrics(self) -> dict[str, Any]:
        """The server's ``/metrics``."""
        return self.envs[0].metrics()


def register_envs() -> None:
    """Register ``wmrl/Remote-v0`` (idempotent)."""
    if ENV_ID not in gym.registry:
        gym.register(id=ENV_ID, entry_point="wmrl_envs.remote:RemoteEnv", disable_env_checker=True)
