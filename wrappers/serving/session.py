"""One client's session: an OpenEnv ``Environment`` over its own env and stack layers, whose
anchor and calibration state is the server's :class:`~wrappers.serving.shared.SharedStack`.

Both transports use it: OpenEnv's WebSocket route (``/ws``: one session per connection) and the
server's HTTP session routes (``/reset`` then ``/step`` with the ``session_id``).

Classes: :class:`StackSession`, :class:`ActionTooLarge`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, EnvironmentMetadata

from wmrl_envs.wire import to_json, value_from_json
from wrappers.serving.models import StackObservation, StackState, TextAction, VectorAction
from wrappers.serving.shared import SharedStack

__all__ = ["StackSession", "ActionTooLarge"]


class ActionTooLarge(ValueError):
    """An action over the server's cap (the HTTP routes answer 413)."""


class StackSession(Environment):
    """A session of a served stack (see the module docstring).

    Args:
        shared: the server's shared stack state.
        make_env: builds this session's fresh env (one per session: episodes are isolated).
        max_action_chars: the cap on a text action's length.
        env_id: the served env id (metadata).
        record: called with each step's seconds (the server's latency statistics).

    Reset keywords (all optional): ``seed``, ``episode_id``, ``group_id`` and ``group_size``
    (the GRPO group; members may be in different sessions), ``task``, and ``options`` (any other
    reset option of the env).
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(
        self,
        shared: SharedStack,
        make_env: Callable[[], Any],
        max_action_chars: int,
        env_id: str,
        record: Callable[[float], None] | None = None,
    ) -> None:
        super().__init__()
        self._record = record
        self.shared = shared
        self.env_id = env_id
        self.max_action_chars = max_action_chars
        self.stack = shared.attach(make_env())
        self.lock = threading.Lock()  # one call at a time per session (HTTP clients may race)
        self.last_active = time.monotonic()
        self._state = StackState()
        self._closed = False

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        group_id: Any = None,
        group_size: int | None = None,
        task: str | None = None,
        options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> StackObservation:
        if kwargs:
            raise ValueError(
                f"unknown reset fields {sorted(kwargs)}; supported: seed, episode_id, group_id, group_size, "
                "task, options"
            )
        opts = dict(options or {})
        for key, value in (("group_id", group_id), ("group_size", group_size), ("task", task)):
            if value is not None:
                opts[key] = value
        obs, info = self.stack.reset(seed=seed, options=opts or None)
        self._state = StackState(episode_id=episode_id, step_count=0, group_id=info.get("group_id"))
        self._state.anchor = info.get("anchor")
        self.last_active = time.monotonic()
        return StackObservation(observation=to_json(obs), info=to_json(info), reward=None, done=False)

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> StackObservation:
        value = self._decode(action)
        t0 = time.perf_counter()
        obs, reward, terminated, truncated, info = self.stack.step(value)
        if self._record is not None:
            self._record(time.perf_counter() - t0)
        self._state.step_count += 1
        self.last_active = time.monotonic()
        return StackObservation(
            observation=to_json(obs),
            info=to_json(info),
            reward=float(reward),
            done=bool(terminated or truncated),
            terminated=bool(terminated),
            truncated=bool(truncated),
        )

    def _decode(self, action: Action) -> Any:
        space = self.stack.action_space
        if isinstance(action, TextAction):
            if len(action.text) > self.max_action_chars:
                raise ActionTooLarge(
                    f"the action is {len(action.text)} characters; the cap is max_action_chars={self.max_action_chars}"
                )
            return action.text
        if isinstance(action, VectorAction):
            try:
                value = value_from_json(space, action.values)
            except ValueError as err:
                raise ValueError(f"action values do not fit the action space {space}: {err}") from None
            if not space.contains(value):
                raise ValueError(f"action {action.values} is outside the action space {space}")
            return value
        raise TypeError(f"unsupported action type {type(action).__name__}")

    @property
    def state(self) -> StackState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name=f"wmrl {self.env_id} ({self.shared.kind} stack)",
            description="A wmrl-envs environment behind its world-model stack (real | wm | wmrl).",
            version="1",
        )

    def close(self) -> None:
        """Detach from the shared stack (an unfinished episode counts as a finished member)."""
        if not self._closed:
            self._closed = True
            self.shared.detach(self.stack)
