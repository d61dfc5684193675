"""DAgger for the MiniVLA: the policy acts, the scripted expert labels the states it reaches.

Behaviour cloning (SFT) teaches the policy the expert's states only; its own small errors
take it to states no demonstration shows, and the errors compound (Ross, Gordon & Bagnell,
2011). A DAgger round rolls the current policy out -- each executed action is the expert's
with probability ``beta``, the policy's otherwise -- while the scripted expert, stepped in
lockstep on the same simulator, labels every decision with its clean action. Every episode
is kept, successful or not: the failures are where the labels teach most. The next SFT run
trains on the demonstrations plus the rounds (``SFTConfig.dagger_dirs``).

Frames are recorded where the policy decides (one per chunk of ``K`` actions, as in its
rollouts and evaluation: the camera renders are the cost), each labelled with the expert's
``K`` actions along the chunk, so a round's ``DemoEpisode.actions`` is ``(T, K, 7)``.

A round is a directory with one ``.npz`` per episode and a JSONL manifest (task, init state,
seed, beta, temperature, the policy checkpoint and its weights' digest, success, steps,
decisions, the policy's agreement with the expert's labels, CPU seconds, the episode's
digest): :class:`DaggerRound` skips the tries its manifest holds, so a killed round resumes,
and refuses a policy other than the one the round started with.

Classes: :class:`DaggerRound`. Functions: :func:`dagger_episode`, :func:`weights_digest`.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents.vla.demos import DemoCache, DemoDataset, DemoEpisode, episode_digest
from agents.vla.evaluate import agrees

__all__ = ["DaggerRound", "dagger_episode", "weights_digest", "agrees", "LABEL_TIMEOUT_RADIUS"]

#: The labelling expert's ``ExpertConfig.timeout_radius`` (m): a move phase times out into the
#: next one only after its timeout's worth of steps within 3 cm of its goal (tolerance 1 cm).
LABEL_TIMEOUT_RADIUS = 0.03


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 of a model's parameters and buffers (names, shapes, bytes): which policy a
    round's states came from."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def dagger_episode(
    env: Any,
    policy: Any,
    init_state: int,
    *,
    seed: int,
    beta: float,
    action_repeat: int = 4,
    image_size: int = 64,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> tuple[DemoEpisode, dict[str, Any]]:
    """One DAgger episode of ``policy`` (a :class:`~agents.vla.model.MiniVLA`) on ``env`` (the
    evaluation's env, :func:`agents.vla.evaluate.policy_env`) from ``init_state``.

    Returns the episode (frames where the policy decided, ``(T, K, 7)`` expert labels) and
    its statistics: ``success`` (the simulator's verdict), ``steps``, ``decisions``,
    ``agreement`` (share of the policy's actions that :func:`agrees` with the label) and
    ``expert_share`` (share of executed actions that were the expert's) and ``expert_phase``
    (the labelling expert's plan phase at the end: how far the task got). The mixing draws
    are seeded by ``(seed, init_state)`` and the env is reset with ``seed``."""
    from agents.vla.expert import ExpertConfig, ScriptedExpert, per_decision
    from agents.vla.rollout import add_views, policy_obs

    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    base = env.unwrapped
    obs, _ = env.reset(seed=seed, options={"init_state": int(init_state)})
    # The expert's move phases time out into the next one (robust when it drives itself), but
    # while the policy drives, a timed-out descend would advance to "grasp" wherever the
    # gripper had wandered and label "close the gripper" there: only steps near the goal count.
    config = ExpertConfig(timeout_radius=LABEL_TIMEOUT_RADIUS)
    expert = ScriptedExpert(base.sim_env, per_decision(config, action_repeat))
    rng = np.random.default_rng([seed, int(init_state)])
    views: list[dict[str, Any]] = []
    labels: list[np.ndarray] = []
    agree = expert_actions = actions = steps = 0
    success = ended = False
    while not ended:
        view = policy_obs(add_views(env, obs, image_size))
        out = policy.act(
            {k: [v] if k == "instruction" else np.asarray(v)[None] for k, v in view.items()},
            temperature=temperature,
            generator=generator,
        )
        chunk = np.asarray(out.actions[0], np.float32).reshape(-1, 7)
        own: list[np.ndarray] = []
        for action in chunk:
            label = expert.act()
            own.append(label)
            agree += agrees(action, label)
            from_expert = bool(rng.random() < beta)
            expert_actions += from_expert
            actions += 1
            for _ in range(action_repeat):
                obs, _, terminated, truncated, info = env.step(label if from_expert else action)
                steps += 1
                if terminated or truncated:
                    ended, success = True, bool(info.get("success"))
                    break
            if ended:
                break
        own += [own[-1]] * (len(chunk) - len(own))  # the episode ended inside the chunk
        views.append(view)
        labels.append(np.stack(own))
    episode = DemoEpisode(
        base.task.instruction,
        np.stack([v["agentview_image"] for v in views]),
        np.stack([v["wrist_image"] for v in views]),
        np.stack([v["proprio"] for v in views]).astype(np.float32),
        np.stack(labels).astype(np.float32),
        {
            "task": base.task.index,
            "init_state": int(init_state),
            "seed": int(seed),
            "beta": float(beta),
            "action_repeat": int(action_repeat),
            "source": "dagger",
        },
    )
    stats = {
        "success": success,
        "steps": steps,
        "decisions": len(views),
        "agreement": round(agree / max(1, actions), 4),
        "expert_share": round(expert_actions / max(1, actions), 4),
        "expert_phase": expert.phase,
    }
    return episode, stats


@dataclass
class DaggerRound:
    """One DAgger round of one policy: episodes in ``root`` (one ``.npz`` each) and a manifest
    ``root/manifest.jsonl`` with one record per try. Readable as a
    :class:`~agents.vla.demos.DemoCache` (``SFTConfig.dagger_dirs``).

    Attributes:
        root: the round's directory.
        policy: the MiniVLA checkpoint that acts.
        beta: probability that an executed action is the expert's (0 = the policy alone).
        temperature: the policy's sampling temperature (0 = greedy, as evaluated).
    """

    root: Path
    policy: str
    beta: float = 0.5
    temperature: float = 0.0
    cache: DemoCache = field(init=False)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self.cache = DemoCache(self.root)

    def try_key(self, task: int, init_state: int, seed: int, action_repeat: int, image_size: int, limit: int) -> str:
        """The identity of one try (and its file stem)."""
        return (
            f"task{task}/init{init_state:02d}-seed{seed}-beta{self.beta:g}-temp{self.temperature:g}"
            f"-repeat{action_repeat}-px{image_size}-limit{limit}"
        )

    def collect(
        self,
        tasks: Sequence[int],
        init_states: Sequence[int],
        *,
        per_init: int = 1,
        seed: int = 0,
        image_size: int = 64,
        action_repeat: int = 4,
        max_episode_steps: int = 520,
        progress: bool = True,
    ) -> list[dict[str, Any]]:
        """Run every try ``(task, init, seed + k)`` the manifest does not hold yet; each record
        is appended (and its episode saved) as soon as it is done. Returns the new records."""
        from tqdm.auto import tqdm

        from agents.vla.evaluate import policy_env
        from agents.vla.model import MiniVLA

        model = MiniVLA.load(self.policy).eval()
        digest = weights_digest(model)
        records = self.cache.records()
        others = {r["policy_digest"] for r in records} - {digest}
        if others:
            raise ValueError(
                f"{self.root} is a DAgger round of another policy (weights {sorted(others)[0][:12]}); "
                f"{self.policy} has {digest[:12]}: start a new round directory"
            )
        done = {r["key"] for r in records}
        todo = [
            (t, i, seed + k)
            for t in tasks
            for i in init_states
            for k in range(per_init)
            if self.try_key(t, i, seed + k, action_repeat, image_size, max_episode_steps) not in done
        ]
        self.root.mkdir(parents=True, exist_ok=True)
        assert self.cache.manifest is not None
        new: list[dict[str, Any]] = []
        env, env_task = None, None
        bar = tqdm(todo, desc="dagger", disable=not progress)
        generator = torch.Generator().manual_seed(seed)
        try:
            for task, init, try_seed in bar:
                if env_task != task:
                    if env is not None:
                        env.close()
                    env = policy_env(task, image_size=image_size, max_episode_steps=max_episode_steps)
                    env_task = task
                t0 = time.process_time()
                episode, stats = dagger_episode(
                    env,
                    model,
                    init,
                    seed=try_seed,
                    beta=self.beta,
                    action_repeat=action_repeat,
                    image_size=image_size,
                    temperature=self.temperature,
                    generator=generator,
                )
                key = self.try_key(task, init, try_seed, action_repeat, image_size, max_episode_steps)
                record = {
                    "key": key,
                    "task": task,
                    "init_state": init,
                    "seed": try_seed,
                    "beta": self.beta,
                    "temperature": self.temperature,
                    "action_repeat": action_repeat,
                    "image_size": image_size,
                    "max_episode_steps": max_episode_steps,
                    "policy": str(self.policy),
                    "policy_digest": digest,
                    "label_timeout_radius": LABEL_TIMEOUT_RADIUS,
                    **stats,
                    "cpu_s": round(time.process_time() - t0, 1),
                    "digest": episode_digest(episode),
                    "file": f"{key}.npz",
                }
                DemoDataset([episode]).save(self.root / record["file"])
                with open(self.cache.manifest, "a") as f:
                    f.write(json.dumps(record) + "\n")
                new.append(record)
                bar.set_postfix(
                    task=task,
                    success=sum(r["success"] for r in new),
                    agree=f"{np.mean([r['agreement'] for r in new]):.2f}",
                )
        finally:
            bar.close()
            if env is not None:
                env.close()
        return new
