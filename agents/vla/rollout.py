"""Closed-loop rollouts of a :class:`~agents.vla.model.MiniVLA` through a LIBERO env stack.

One episode = reset with the group's options, then ``act`` / ``step`` until the env ends the
episode (it grades the final step itself: success, or the world model's prediction under a
``wm`` / ``wmrl`` stack). Every step the policy acted on becomes a *row* (its observation,
the 7 sampled action tokens and their behaviour log-probabilities) for the GRPO loss; the
final graded step executes no action (see ``LiberoLongEnv``), so its row is dropped.
The episode's reward, source and anchor flag are read from the final step's ``info``
(``trajectory_reward``, ``source``, ``anchor``) -- the only way the agent learns what the
stack did.

Classes: :class:`VLAEpisode`, :class:`RolloutTimes`. Functions: :func:`run_episode`,
:func:`run_group`, :func:`policy_obs`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

__all__ = [
    "VLAEpisode",
    "RolloutTimes",
    "ActingPolicy",
    "EpisodeEnv",
    "run_episode",
    "run_group",
    "policy_obs",
    "add_views",
    "POLICY_KEYS",
    "VIEWS",
]


class ActingPolicy(Protocol):
    """What a rollout needs of a policy (:class:`~agents.vla.model.MiniVLA`, the evaluation's
    random policy): a batch of observations in, an ``ActOutput``-like result out
    (``actions``, ``tokens``, ``logprobs``, one row per observation)."""

    def act(self, obs: Mapping[str, Any], temperature: float = 1.0, generator: Any = None) -> Any: ...


class EpisodeEnv(Protocol):
    """What a rollout needs of an env (a LIBERO env or its wrapper stack): Gymnasium's
    ``reset`` / ``step`` with the group's reset options."""

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]: ...

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]: ...


#: Observation keys a MiniVLA reads.
POLICY_KEYS = ("agentview_image", "wrist_image", "proprio", "instruction")


#: MuJoCo camera names of the two views and the observation keys they fill.
VIEWS = {"agentview_image": "agentview", "wrist_image": "robot0_eye_in_hand"}


def add_views(env: Any, obs: dict[str, Any], image_size: int) -> dict[str, Any]:
    """``obs`` with upright ``agentview_image`` / ``wrist_image`` rendered now, when the env does
    not render cameras itself (``LiberoLongEnv(cameras=False, render_mode="rgb_array")``): the
    policy's views cost a render only at the steps it decides on."""
    if all(k in obs for k in VIEWS):
        return obs
    sim = env.unwrapped.sim_env.sim
    out = dict(obs)
    for key, camera in VIEWS.items():
        out[key] = np.ascontiguousarray(sim.render(camera_name=camera, width=image_size, height=image_size)[::-1])
    return out


def policy_obs(obs: dict[str, Any]) -> dict[str, Any]:
    """The part of an env observation the policy reads (copied: envs may reuse buffers).

    >>> policy_obs({"proprio": np.zeros(9), "instruction": "x", "object_state": np.zeros(3)}).keys()
    dict_keys(['proprio', 'instruction'])
    """
    return {k: (np.array(v) if isinstance(v, np.ndarray) else v) for k, v in obs.items() if k in POLICY_KEYS}


@dataclass
class RolloutTimes:
    """Wall seconds spent acting (policy) and stepping (env, grading included), and counts."""

    act_seconds: float = 0.0
    render_seconds: float = 0.0
    env_seconds: float = 0.0
    reset_seconds: float = 0.0
    actions: int = 0
    env_steps: int = 0

    def merge(self, other: RolloutTimes) -> None:
        for k in self.__dataclass_fields__:
            setattr(self, k, getattr(self, k) + getattr(other, k))

    def summary(self) -> dict[str, float | None]:
        return {
            "time/act_ms_per_action": 1000 * self.act_seconds / self.actions if self.actions else None,
            "time/env_steps_per_s": self.env_steps / self.env_seconds if self.env_seconds else None,
            "time/render_ms_per_action": 1000 * self.render_seconds / self.actions if self.actions else None,
            "time/act_s": self.act_seconds,
            "time/env_s": self.env_seconds,
            "time/reset_s": self.reset_seconds,
        }


@dataclass
class VLAEpisode:
    """One rollout. ``rows`` hold the observations acted on (one per decision); ``tokens`` /
    ``logprobs`` are ``(T, tokens per decision)`` (7, or ``7 K`` for a chunked policy).
    ``reward`` is the stack's trajectory reward (``None`` = unknown), ``success`` what the
    grading outcome says, ``goal_reached`` the simulator's own check (the episode
    terminated), recorded for diagnostics only."""

    group_id: Any
    init_state: int
    rows: list[dict[str, Any]] = field(default_factory=list)
    tokens: list[torch.Tensor] = field(default_factory=list)
    logprobs: list[torch.Tensor] = field(default_factory=list)
    reward: float | None = None
    source: str | None = None
    anchor: bool = False
    success: bool | None = None
    goal_reached: bool = False
    steps: int = 0
    final_info: dict[str, Any] = field(default_factory=dict)

    @property
    def graded_steps(self) -> int:
        """An episode asks for one grading, at its end."""
        return 1

    def token_tensor(self) -> torch.Tensor:
        return torch.stack(self.tokens) if self.tokens else torch.zeros((0, 0), dtype=torch.long)

    def logprob_tensor(self) -> torch.Tensor:
        return torch.stack(self.logprobs) if self.logprobs else torch.zeros((0, 0))


def run_episode(
    env: EpisodeEnv,
    policy: ActingPolicy,
    options: dict[str, Any],
    *,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    keep_rows: bool = True,
    times: RolloutTimes | None = None,
    seed: int | None = None,
    action_repeat: int = 1,
    image_size: int = 64,
    execute_actions: int | None = None,
) -> VLAEpisode:
    """Roll ``policy`` out for one episode of ``env`` (single env; the stack or the bare env).

    Each decision's action is held for ``action_repeat`` env steps (a chunked policy's ``K``
    actions one after another, each held as long); the camera views are rendered (:func:`add_views`) only at decision steps when the env has no cameras.

    ``execute_actions = m`` executes only the first ``m`` actions of each chunk before the
    policy decides again (receding horizon; ``None``: all ``K``, open loop). For evaluation:
    an episode's stored tokens are whole chunks, whose unexecuted tail the reward never saw."""
    if execute_actions is not None and (isinstance(execute_actions, bool) or execute_actions < 1):
        raise ValueError(f"execute_actions must be None or an int >= 1, got {execute_actions!r}")
    times = times if times is not None else RolloutTimes()
    t0 = time.perf_counter()
    obs, info = env.reset(seed=seed, options=dict(options))
    times.reset_seconds += time.perf_counter() - t0
    ep = VLAEpisode(options.get("group_id"), int(info.get("init_state", options.get("init_state", -1))))
    ep.anchor = bool(info.get("anchor", False))
    while True:
        t0 = time.perf_counter()
        p_obs = policy_obs(add_views(env, obs, image_size))
        times.render_seconds += time.perf_counter() - t0
        t0 = time.perf_counter()
        out = policy.act(
            {k: [v] if k == "instruction" else np.asarray(v)[None] for k, v in p_obs.items()},
            temperature=temperature,
            generator=generator,
        )
        times.act_seconds += time.perf_counter() - t0
        times.actions += 1
        # A chunked policy's decision is K actions, executed open loop: one row per decision.
        chunk = np.asarray(out.actions[0]).reshape(-1, 7)[:execute_actions]
        ended = False
        for k, action in enumerate(chunk):
            for r in range(action_repeat):
                t0 = time.perf_counter()
                obs, _, terminated, truncated, info = env.step(action)
                times.env_seconds += time.perf_counter() - t0
                times.env_steps += 1
                ep.steps += 1
                first = k == 0 and r == 0
                if first and not info.get("graded", False) and keep_rows:  # a graded step executes no action
                    ep.rows.append(p_obs)
                    ep.tokens.append(out.tokens[0])
                    ep.logprobs.append(out.logprobs[0])
                ended = terminated or truncated
                if ended:
                    break
            if ended:
                break
        if ended:
            ep.goal_reached = bool(terminated)
            ep.reward = info.get("trajectory_reward")
            ep.source = info.get("source", "env" if ep.reward is not None else None)
            ep.success = info.get("success")
            ep.anchor = bool(info.get("anchor", ep.anchor))
            ep.final_info = dict(info)
            return ep


def run_group(
    env: EpisodeEnv,
    policy: ActingPolicy,
    group_id: Any,
    init_state: int,
    group_size: int,
    *,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    times: RolloutTimes | None = None,
    keep_rows: bool = True,
    action_repeat: int = 1,
    image_size: int = 64,
) -> list[VLAEpisode]:
    """``group_size`` episodes from the same initial state, sharing ``group_id`` (one GRPO group).

    Members run one after another on the one env (a LIBERO scene costs ~2 GB per copy).
    """
    from wrappers import StackHandle

    options: dict[str, Any] = {"init_state": int(init_state), "group_id": group_id}
    if StackHandle(env).has_anchors:  # the anchor layer consumes it; a bare env would refuse it
        options["group_size"] = int(group_size)
    return [
        run_episode(
            env,
            policy,
            options,
            temperature=temperature,
            generator=generator,
            times=times,
            keep_rows=keep_rows,
            action_repeat=action_repeat,
            image_size=image_size,
        )
        for _ in range(group_size)
    ]
