"""Typed OpenEnv messages of ``wmrl-serve``: actions, observations, state (pydantic models).

The action model follows the served env's action space: :class:`TextAction` for text actions
(AutoResearch: a reply, i.e. one fenced script or ``REQUEST_INFO: <topic>``), :class:`VectorAction`
for ``Box`` actions (LIBERO: 7 floats). Every observation is a :class:`StackObservation`: the
env's observation as JSON, the step's ``info`` (the suite's info policy: an unknown value is
absent, never ``None`` or 0), ``terminated`` / ``truncated`` and OpenEnv's ``reward`` / ``done``.

>>> TextAction(text="REQUEST_INFO: metric").text
'REQUEST_INFO: metric'
>>> StackObservation(observation="hi", reward=0.0, done=False).terminated
False
"""

from __future__ import annotations

from typing import Any

from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

__all__ = ["TextAction", "VectorAction", "StackObservation", "StackState", "action_model"]


class TextAction(Action):
    """A text action: the agent's whole reply (AutoResearch: one fenced Python script, or
    ``REQUEST_INFO: <topic>``). Longer than the env's ``max_action_chars`` is refused (413)."""

    text: str = Field(description="the reply; its length is capped by the server's max_action_chars")


class VectorAction(Action):
    """A numeric action (LIBERO: 7 floats, end-effector delta + gripper), in the env's ``Box``."""

    values: list[float] = Field(description="the action vector, flattened in the action space's shape")


class StackObservation(Observation):
    """What a reset or step returns: the observation, the stack's ``info``, and the episode end."""

    observation: Any = Field(description="the env's observation as JSON (text, or a dict of arrays as lists)")
    info: dict[str, Any] = Field(default_factory=dict, description="the stack's info; unknown values are absent")
    terminated: bool = Field(default=False, description="the episode ended (Gymnasium's terminated)")
    truncated: bool = Field(default=False, description="the episode was cut (Gymnasium's truncated)")


class StackState(State):
    """A session's state: OpenEnv's episode id and step count, plus its group."""

    group_id: Any = Field(default=None, description="the GRPO group of the current episode")
    anchor: bool | None = Field(default=None, description="whether that group is an anchor group")


def action_model(space_json: dict[str, Any]) -> type[Action]:
    """The action model for a served action space (as :func:`wmrl_envs.wire.space_to_json` gives it)."""
    return TextAction if space_json.get("type") == "text" else VectorAction
