"""Multi-turn rollouts of an LLM policy through a Gymnasium env or vector env, in GRPO groups.

A *slot* is one sub-env. Groups are placed on consecutive slots and reset together with
``reset(options={"task": t, "group_id": g, "group_size": n, "reset_mask": mask})``
(``group_size`` only when an ``AnchorWrapper`` is in the stack to consume it). All live
episodes advance in lock-step so one batched ``generate`` serves every slot per turn;
slots whose episode already ended receive an idle action (an empty reply: no grading
request, so it costs nothing) until the round ends.

The token sequence of each episode is kept as ``(tokens, is_action)`` segments: the
agent's sampled tokens exactly as sampled (mask 1) and the chat-template tokens of the
observations between them (mask 0).

Classes: :class:`Episode`, :class:`PhaseTimer`, :class:`Rollout`.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from agents.grpo import concat_segments
from agents.llm.policy import LLMPolicy
from agents.llm.scaffolds import Scaffold, TaskSpec
from wmrl_envs.vector import sub_info
from wrappers import StackHandle

__all__ = ["Episode", "PhaseTimer", "Rollout"]


@dataclass
class Episode:
    """One member of a group: its conversation, tokens and outcome."""

    slot: int
    task: str
    group_id: Hashable
    spec: TaskSpec
    messages: list[dict[str, str]]
    category: str = ""
    segments: list[tuple[list[int], bool]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    done: bool = False
    turns: int = 0
    reward: float | None = None
    source: str | None = None
    anchor: bool = False
    outcomes: list[Any] = field(default_factory=list)
    graded_steps: int = 0
    final_info: dict[str, Any] = field(default_factory=dict)

    def context(self) -> list[int]:
        return [t for ids, _ in self.segments for t in ids]

    def sequence(self) -> tuple[list[int], list[int]]:
        """Token ids and loss mask (1 = the agent's own tokens)."""
        return concat_segments(self.segments)


class PhaseTimer:
    """Wall and CPU seconds per phase. CPU counts this process plus its finished children
    (sandbox runs are children, so their CPU lands in the phase that waited for them)."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.child_cpu: dict[str, float] = {}

    @staticmethod
    def _cpu() -> tuple[float, float]:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return time.process_time(), children.ru_utime + children.ru_stime

    def add(self, phase: str, wall: float, cpu: float, child_cpu: float = 0.0) -> None:
        self.wall[phase] = self.wall.get(phase, 0.0) + wall
        self.cpu[phase] = self.cpu.get(phase, 0.0) + cpu + child_cpu
        self.child_cpu[phase] = self.child_cpu.get(phase, 0.0) + child_cpu

    def measure(self, phase: str | None) -> _Span:
        """Context manager timing a span; ``phase=None`` measures without recording."""
        return _Span(self, phase)


class _Span:
    def __init__(self, timer: PhaseTimer, phase: str | None) -> None:
        self.timer, self.phase = timer, phase

    def __enter__(self) -> _Span:
        self.t0 = time.perf_counter()
        self.c0, self.k0 = PhaseTimer._cpu()
        return self

    def __exit__(self, *exc: Any) -> None:
        c1, k1 = PhaseTimer._cpu()
        self.wall = time.perf_counter() - self.t0
        self.cpu, self.child_cpu = c1 - self.c0, k1 - self.k0
        if self.phase is not None:
            self.timer.add(self.phase, self.wall, self.cpu, self.child_cpu)


class Rollout:
    """Runs GRPO groups of multi-turn episodes through ``env`` with ``policy`` and ``scaffold``.

    Args:
        env: a ``gymnasium.Env`` (one slot) or ``VectorEnv`` (``num_envs`` slots, a multiple
            of ``group_size`` unless ``group_size`` is 1). Same-step or next-step autoreset.
        policy, scaffold: the agent.
        group_size: members per group.
        max_new_tokens, temperature, top_p, generation_batch_size: sampling settings.
        idle_action: sent to slots whose episode ended while others run.
    """

    def __init__(
        self,
        env: gym.Env | VectorEnv,
        policy: LLMPolicy,
        scaffold: Scaffold,
        *,
        group_size: int,
        max_new_tokens: int = 96,
        temperature: float = 1.0,
        top_p: float = 1.0,
        generation_batch_size: int | None = None,
        idle_action: str = "",
    ) -> None:
        self.env = env
        self.vector = isinstance(env, VectorEnv)
        self.num_slots = env.num_envs if isinstance(env, VectorEnv) else 1
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        if self.num_slots % group_size and self.num_slots > 1:
            raise ValueError(f"num_envs={self.num_slots} must be a multiple of group_size={group_size}")
        if self.vector:
            mode = AutoresetMode(env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP))
            if mode == AutoresetMode.DISABLED:
                raise ValueError("Rollout needs a vector env with same-step or next-step autoreset, not DISABLED")
            self.autoreset = mode
        self.policy, self.scaffold = policy, scaffold
        self.group_size = group_size
        self.sampling: dict[str, Any] = dict(
            max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, batch_size=generation_batch_size
        )
        self.idle_action = idle_action
        self.stack = StackHandle(env)
        self.has_anchor = self.stack.has_anchors

    # ----- env plumbing -------------------------------------------------------------
    def _reset(self, slots: Sequence[int], options: dict[str, Any]) -> list[tuple[Any, dict[str, Any]]]:
        if not self.vector:
            obs, info = self.env.reset(options=options)
            return [(obs, info)]
        mask = np.zeros(self.num_slots, dtype=np.bool_)
        mask[list(slots)] = True
        obs, infos = self.env.reset(options={**options, "reset_mask": mask})
        return [(obs[i], sub_info(infos, i)) for i in slots]

    def _step(self, actions: list[str]) -> list[tuple[Any, bool, dict[str, Any]]]:
        """Per slot ``(obs, ended, info of this step)``."""
        if not self.vector:
            obs, _, terminated, truncated, info = self.env.step(actions[0])
            return [(obs, bool(terminated or truncated), info)]
        assert isinstance(self.env, VectorEnv)
        obs, _, terminated, truncated, infos = self.env.step(np.array(actions, dtype=object))
        out: list[tuple[Any, bool, dict[str, Any]]] = []
        for i in range(self.num_slots):
            ended = bool(terminated[i] or truncated[i])
            if ended and self.autoreset == AutoresetMode.SAME_STEP:
                info = sub_info(infos.get("final_info", {}), i)
                out.append((infos["final_obs"][i], ended, info))
            else:
                out.append((obs[i], ended, sub_info(infos, i)))
        return out

    # ----- one round: up to num_slots // group_size groups ----------------------------
    def run(
        self, groups: Sequence[tuple[str, Hashable]], timer: PhaseTimer, *, seed: int | None = None
    ) -> list[Episode]:
        """Roll out ``group_size`` episodes for each ``(task, group_id)``; returns all episodes."""
        per_round = max(1, self.num_slots // self.group_size)
        episodes: list[Episode] = []
        for start in range(0, len(groups), per_round):
            episodes.extend(self._round(groups[start : start + per_round], timer, seed))
        if self.stack.overlaps_anchors:
            with timer.measure("real_grading"):  # the anchors' real runs still on the critical path
                records = self.stack.collect_anchors(wait=True)
            self.land_anchor_rewards(episodes, records)
        return episodes

    @staticmethod
    def land_anchor_rewards(episodes: Sequence[Episode], records: Sequence[dict[str, Any]]) -> int:
        """Overlap mode: give anchor members their real rewards from
        :meth:`~wrappers.anchor.AnchorWrapper.collect` records (matched by ``anchor_ticket``);
        their source becomes ``"env"`` as in a synchronous anchor group. Returns how many."""
        by_ticket = {r["ticket"]: r for r in records}
        patched = 0
        for e in episodes:
            record = by_ticket.get(e.final_info.get("anchor_ticket"))
            if record is None or not record["graded"]:
                continue
            e.reward = None if record["reward"] is None else float(record["reward"])
            e.source = "env"
            if record["group_result"] is not None:
                e.final_info = {**e.final_info, "group_result": record["group_result"]}
            patched += 1
        return patched

    def _round(self, groups: Sequence[tuple[str, Hashable]], timer: PhaseTimer, seed: int | None) -> list[Episode]:
        episodes: list[Episode] = []
        with timer.measure("env_reset"):
            if self.vector:
                for j, (task, gid) in enumerate(groups):
                    slots = list(range(j * self.group_size, (j + 1) * self.group_size))
                    for slot, (obs, info) in zip(slots, self._reset(slots, self._options(task, gid))):
                        episodes.append(self._start(slot, task, gid, obs, info))
            else:  # one slot: members run one after another
                return [ep for task, gid in groups for ep in self._sequential(task, gid, timer, seed)]
        self._play(episodes, timer, seed)
        return episodes

    def _sequential(self, task: str, gid: Hashable, timer: PhaseTimer, seed: int | None) -> list[Episode]:
        out = []
        for member in range(self.group_size):
            options = self._options(task, gid)
            with timer.measure("env_reset"):
                ((obs, info),) = self._reset([0], options)
            episode = self._start(0, task, gid, obs, info)
            self._play([episode], timer, None if seed is None else seed + member)
            out.append(episode)
        return out

    def _options(self, task: str, gid: Hashable) -> dict[str, Any]:
        options: dict[str, Any] = {"task": task, "group_id": gid}
        if self.has_anchor:
            options["group_size"] = self.group_size
        return options

    def _start(self, slot: int, task: str, gid: Hashable, obs: Any, info: dict[str, Any]) -> Episode:
        spec = TaskSpec.from_info(info)
        messages = self.scaffold.initial_messages(str(obs), spec)
        category = str(info.get("category") or spec.task_type)
        episode = Episode(slot, task, gid, spec, messages, category, anchor=bool(info.get("anchor", False)))
        episode.segments.append((self.policy.chat_ids(messages) + self._prefix_ids(), False))
        return episode

    def _prefix_ids(self) -> list[int]:
        prefix = getattr(self.scaffold, "response_prefix", "")
        return list(self.policy.tokenizer(prefix, add_special_tokens=False)["input_ids"]) if prefix else []

    def _play(self, episodes: list[Episode], timer: PhaseTimer, seed: int | None) -> None:
        turn = 0
        while any(not e.done for e in episodes):
            live = [e for e in episodes if not e.done]
            with timer.measure("generation"):
                completions = self.policy.generate(
                    [e.context() for e in live], seed=None if seed is None else seed + 1000 * turn, **self.sampling
                )
            actions = [self.idle_action] * self.num_slots
            for e, ids in zip(live, completions):
                text = getattr(self.scaffold, "response_prefix", "") + self.policy.decode(ids)
                e.segments.append((ids, True))
                e.texts.append(text)
                e.messages.append({"role": "assistant", "content": text})
                e.actions.append(self.scaffold.to_action(text, e.spec))
                actions[e.slot] = e.actions[-1]
            with timer.measure(None) as span:
                results = self._step(actions)
            self._attribute_env_time(timer, span, [results[e.slot][2] for e in live])
            for e in live:
                obs, ended, info = results[e.slot]
                self._record(e, obs, ended, info)
            turn += 1

    def _record(self, e: Episode, obs: Any, ended: bool, info: dict[str, Any]) -> None:
        e.turns += 1
        e.graded_steps += bool(info.get("graded"))
        if info.get("anchor") is not None:  # informative selection decides at the first step, not the reset
            e.anchor = bool(info["anchor"])
        if info.get("source") is not None:
            e.source = info["source"]
        if ended:
            e.done = True
            e.final_info = info
            reward = info.get("trajectory_reward")
            e.reward = None if reward is None else float(reward)
            e.outcomes = list(info.get("outcomes") or [])
            return
        message = self.scaffold.followup_message(str(obs), e.spec)
        ended_with_eos = bool(e.segments[-1][0]) and e.segments[-1][0][-1] == self.policy.eos_token_id
        follow = self.policy.followup_ids(e.messages, message, ended_with_eos=ended_with_eos)
        e.segments.append((follow + self._prefix_ids(), False))
        e.messages.append(message)

    @staticmethod
    def _attribute_env_time(timer: PhaseTimer, span: _Span, infos: list[dict[str, Any]]) -> None:
        """Split one env step into real grading / world-model grading / env overhead.

        Wall: the wrappers' ``real_seconds`` (max over slots, they run in parallel under
        AsyncVectorEnv and are reported per slot as the step's wall) and summed
        ``wm_seconds`` (one batched call). Without wrappers, a step whose info says it graded
        is real grading. CPU: children (sandbox processes) go to real grading, this
        process's CPU to the world model in proportion to its wall share.
        """
        real_wall = max((float(i.get("real_seconds") or 0.0) for i in infos), default=0.0)
        wm_wall = sum(float(i.get("wm_seconds") or 0.0) for i in infos)
        wrapped = any("real_seconds" in i for i in infos)
        if not wrapped and any(i.get("graded") for i in infos):
            real_wall = span.wall
        real_wall = min(real_wall, span.wall)
        wm_wall = min(wm_wall, span.wall - real_wall)
        other_wall = span.wall - real_wall - wm_wall
        wm_cpu = span.cpu * (wm_wall / span.wall) if span.wall > 0 else 0.0
        timer.add("real_grading", real_wall, 0.0, span.child_cpu)
        timer.add("wm_grading", wm_wall, wm_cpu)
        timer.add("env_other", other_wall, span.cpu - wm_cpu)
