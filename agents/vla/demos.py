"""Demonstrations for SFT: scripted-expert episodes on the real simulator, saved compressed.

:func:`demonstrate` runs :func:`~agents.vla.expert.run_expert` with DART noise on a
state-only :class:`~wmrl_envs.libero.env.LiberoLongEnv`, rendering the two camera views at
decision steps only (what the policy sees); :class:`DemoCache` (many tasks, one file per
episode in a cache directory, a committed manifest, resumable) keeps only the episodes the *simulator* marks successful
(``info["success"]`` of the graded final step). Goal-placer
episodes (:func:`wmrl_envs.libero.goals.achieve_goal`, which teleports objects) are never
demonstrations: nothing here calls it. :func:`load_libero_hdf5` reads the original LIBERO
HDF5 demonstrations instead (optional ``h5py``).

Classes: :class:`DemoEpisode`, :class:`DemoDataset`, :class:`DemoCache`. Functions: :func:`demonstrate`,
:func:`episode_digest`, :func:`default_demo_cache`, :func:`load_libero_hdf5`.

>>> ep = DemoEpisode("open the drawer", np.zeros((3, 8, 8, 3), np.uint8), np.zeros((3, 8, 8, 3), np.uint8),
...                  np.zeros((3, 9), np.float32), np.zeros((3, 7), np.float32), {"task": 3})
>>> import tempfile, os
>>> path = DemoDataset([ep, ep]).save(os.path.join(tempfile.mkdtemp(), "demos.npz"))
>>> again = DemoDataset.load(path)
>>> len(again), again.frames, again.episodes[0].meta
(2, 6, {'task': 3})
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agents.vla.tokenizer import dataset_statistics

__all__ = [
    "DemoEpisode",
    "DemoDataset",
    "DemoCache",
    "demonstrate",
    "episode_digest",
    "default_demo_cache",
    "load_libero_hdf5",
    "merge",
]


@dataclass
class DemoEpisode:
    """One demonstration: per-step observations and the action taken on each.

    Attributes:
        instruction: language instruction.
        agentview / wrist: ``(T, S, S, 3)`` uint8 upright images.
        proprio: ``(T, 9)`` float32 (end-effector position, quaternion, fingers).
        actions: ``(T, 7)`` float32 env actions (the expert's clean labels), or ``(T, K, 7)``
            action chunks: the expert's labels for the ``K`` decisions a chunked policy executed
            from each frame (:mod:`agents.vla.dagger`, which records views only where the
            policy decided).
        meta: task index, init state, noise, seed.
    """

    instruction: str
    agentview: np.ndarray
    wrist: np.ndarray
    proprio: np.ndarray
    actions: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.actions)


@dataclass
class DemoDataset:
    """A list of :class:`DemoEpisode`, saved as one compressed ``.npz``."""

    episodes: list[DemoEpisode] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.episodes)

    @property
    def frames(self) -> int:
        return sum(len(e) for e in self.episodes)

    def save(self, path: str | Path) -> Path:
        arrays: dict[str, Any] = {}
        header = []
        for i, e in enumerate(self.episodes):
            arrays.update(
                {
                    f"agentview_{i}": e.agentview,
                    f"wrist_{i}": e.wrist,
                    f"proprio_{i}": e.proprio,
                    f"actions_{i}": e.actions,
                }
            )
            header.append({"instruction": e.instruction, "meta": e.meta})
        arrays["header"] = np.array(json.dumps(header))
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(path, **arrays)
        return path

    @classmethod
    def load(cls, *paths: str | Path) -> DemoDataset:
        """Load and concatenate one or more saved datasets."""
        episodes = []
        for path in paths:
            with np.load(path, allow_pickle=False) as z:
                for i, h in enumerate(json.loads(str(z["header"]))):
                    episodes.append(
                        DemoEpisode(
                            h["instruction"],
                            z[f"agentview_{i}"],
                            z[f"wrist_{i}"],
                            z[f"proprio_{i}"],
                            z[f"actions_{i}"],
                            h["meta"],
                        )
                    )
        return cls(episodes)

    def statistics(self) -> dict[str, Any]:
        """One dataset's ``dataset_statistics.json`` entry (q01/q99 of actions, proprio stats)."""
        actions = np.concatenate([e.actions.reshape(-1, e.actions.shape[-1]) for e in self.episodes])
        proprio = np.concatenate([e.proprio for e in self.episodes])
        stats = dataset_statistics(actions, proprio)
        stats["num_trajectories"] = len(self.episodes)
        return stats


def episode_digest(episode: DemoEpisode) -> str:
    """SHA-256 of a demonstration's instruction and arrays (shape, dtype and bytes): two
    episodes with the same digest are byte-for-byte the same demonstration."""
    h = hashlib.sha256(episode.instruction.encode())
    for a in (episode.agentview, episode.wrist, episode.proprio, episode.actions):
        a = np.ascontiguousarray(a)
        h.update(f"{a.shape}{a.dtype}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def demonstrate(
    env: Any,
    init_state: int,
    *,
    seed: int,
    noise_std: float,
    image_size: int = 64,
    action_repeat: int = 4,
    expert_style: str = "phases",
) -> tuple[DemoEpisode, bool, int]:
    """One scripted-expert episode of ``env`` (a state-only
    :class:`~wmrl_envs.libero.env.LiberoLongEnv`, ``cameras=False``) from ``init_state``,
    recorded whether it succeeds or not: ``(episode, success, env steps)``.

    One frame per decision (each held ``action_repeat`` env steps), its two camera views
    rendered at that decision (:func:`agents.vla.rollout.add_views`: what the policy sees in
    GRPO rollouts and evaluation). The expert's noise is seeded by ``(seed, init_state)`` and
    the env is reset with ``seed``, so the same arguments give the same demonstration.
    ``expert_style`` is :attr:`~agents.vla.expert.ExpertConfig.style`."""
    from agents.vla.expert import ExpertConfig, run_expert

    base = env.unwrapped
    result = run_expert(
        env,
        init_state,
        ExpertConfig(noise_std=noise_std, style=expert_style),
        seed=seed,
        record=True,
        action_repeat=action_repeat,
        image_size=image_size,
    )
    obs = result.observations
    episode = DemoEpisode(
        base.task.instruction,
        np.stack([o["agentview_image"] for o in obs]),
        np.stack([o["wrist_image"] for o in obs]),
        np.stack([o["proprio"] for o in obs]).astype(np.float32),
        np.stack(result.actions).astype(np.float32),
        {
            "task": base.task.index,
            "init_state": int(init_state),
            "seed": int(seed),
            "noise_std": float(noise_std),
            "action_repeat": int(action_repeat),
            "source": "scripted-expert",
            **({"expert_style": expert_style} if expert_style != "phases" else {}),
        },
    )
    return episode, bool(result.success), int(result.steps)


def _demo_env(task_id: int, image_size: int, max_episode_steps: int) -> Any:
    from wmrl_envs.libero.env import LiberoLongEnv

    return LiberoLongEnv(
        task_id=task_id,
        cameras=False,
        render_mode="rgb_array",
        image_size=image_size,
        record_frames=False,
        max_episode_steps=max_episode_steps,
    )


def default_demo_cache() -> Path:
    """``$WMRL_CACHE/vla-demos`` (default ``~/.cache/wmrl/vla-demos``): demonstrations are data,
    not source; only their manifest is committed."""
    return Path(os.environ.get("WMRL_CACHE", Path.home() / ".cache" / "wmrl")) / "vla-demos"


@dataclass
class DemoCache:
    """Demonstrations of many tasks in a cache directory, one ``.npz`` per kept episode, and a
    JSONL manifest with one record per try (kept or not): task, init state, seed, noise,
    decision rate, image size, episode limit, success, steps, frames, CPU seconds and the
    episode's :func:`episode_digest`. :meth:`collect` skips the tries the manifest already
    holds, so a killed run continues where it stopped; :meth:`reproduce` re-runs a record's
    try and checks it is byte-for-byte the same demonstration.

    Attributes:
        root: the cache directory (:func:`default_demo_cache`).
        manifest: the manifest file (default ``root/manifest.jsonl``; commit it to make the set
            reproducible).
    """

    root: Path = field(default_factory=default_demo_cache)
    manifest: Path | None = None

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self.manifest = Path(self.manifest) if self.manifest is not None else self.root / "manifest.jsonl"

    @staticmethod
    def try_key(
        task: int,
        init_state: int,
        seed: int,
        noise_std: float,
        action_repeat: int,
        image_size: int,
        max_steps: int,
        expert_style: str = "phases",
    ) -> str:
        """The identity of one try (and its file stem): every argument changes the episode
        (the default expert style is left out of the key, as before styles existed)."""
        return (
            f"task{task}/init{init_state:02d}-seed{seed}-noise{noise_std:g}-repeat{action_repeat}"
            f"-px{image_size}-limit{max_steps}" + ("" if expert_style == "phases" else f"-{expert_style}")
        )

    @classmethod
    def record_key(cls, record: Mapping[str, Any]) -> str:
        """:meth:`try_key` of a manifest record (from its fields, so records written before the
        key named the episode limit still count as done)."""
        return cls.try_key(
            int(record["task"]),
            int(record["init_state"]),
            int(record["seed"]),
            float(record["noise_std"]),
            int(record["action_repeat"]),
            int(record["image_size"]),
            int(record["max_episode_steps"]),
            record.get("expert_style", "phases"),
        )

    def records(self) -> list[dict[str, Any]]:
        assert self.manifest is not None
        if not self.manifest.is_file():
            return []
        return [json.loads(line) for line in self.manifest.read_text().splitlines() if line.strip()]

    def collect(
        self,
        tasks: Sequence[int],
        init_states: Sequence[int],
        *,
        per_init: int = 1,
        noise_std: float = 0.05,
        seed: int = 0,
        image_size: int = 64,
        action_repeat: int = 4,
        max_episode_steps: int = 600,
        expert_style: str = "phases",
        progress: bool = True,
    ) -> list[dict[str, Any]]:
        """Run every try ``(task, init, seed + k)`` the manifest does not hold yet; returns the
        new records. Each record is appended (and its episode saved) as soon as it is done."""
        from tqdm.auto import tqdm

        assert self.manifest is not None
        done = {self.record_key(r) for r in self.records()}
        todo = [
            (t, i, seed + k)
            for t in tasks
            for i in init_states
            for k in range(per_init)
            if self.try_key(t, i, seed + k, noise_std, action_repeat, image_size, max_episode_steps, expert_style)
            not in done
        ]
        self.manifest.parent.mkdir(parents=True, exist_ok=True)
        new: list[dict[str, Any]] = []
        env, env_task = None, None
        bar = tqdm(todo, desc="demos", disable=not progress)
        try:
            for task, init, try_seed in bar:
                if env_task != task:
                    if env is not None:
                        env.close()
                    env, env_task = _demo_env(task, image_size, max_episode_steps), task
                t0 = time.process_time()
                episode, success, steps = demonstrate(
                    env,
                    init,
                    seed=try_seed,
                    noise_std=noise_std,
                    image_size=image_size,
                    action_repeat=action_repeat,
                    expert_style=expert_style,
                )
                key = self.try_key(
                    task, init, try_seed, noise_std, action_repeat, image_size, max_episode_steps, expert_style
                )
                record = {
                    "key": key,
                    "task": task,
                    "init_state": init,
                    "seed": try_seed,
                    "noise_std": noise_std,
                    "action_repeat": action_repeat,
                    "image_size": image_size,
                    "max_episode_steps": max_episode_steps,
                    **({"expert_style": expert_style} if expert_style != "phases" else {}),
                    "success": success,
                    "steps": steps,
                    "frames": len(episode),
                    "cpu_s": round(time.process_time() - t0, 1),
                    "digest": episode_digest(episode),
                    "file": f"{key}.npz" if success else None,
                }
                if success:
                    DemoDataset([episode]).save(self.root / record["file"])
                with open(self.manifest, "a") as f:
                    f.write(json.dumps(record) + "\n")
                new.append(record)
                bar.set_postfix(task=task, kept=sum(r["success"] for r in new), of=len(new))
        finally:
            bar.close()
            if env is not None:
                env.close()
        return new

    def paths(self, tasks: Sequence[int] | None = None) -> list[Path]:
        """The kept episodes' files (of ``tasks`` only, when given) that exist in the cache."""
        return [
            self.root / r["file"]
            for r in self.records()
            if r.get("file") and (tasks is None or r["task"] in tasks) and (self.root / r["file"]).is_file()
        ]

    def load(self, tasks: Sequence[int] | None = None) -> DemoDataset:
        """Every kept episode (of ``tasks``) as one dataset."""
        paths = self.paths(tasks)
        if not paths:
            raise FileNotFoundError(
                f"no demonstrations in {self.root} (manifest {self.manifest}); run `python -m agents.vla demos`"
            )
        return DemoDataset.load(*paths)

    @staticmethod
    def reproduce(record: Mapping[str, Any]) -> tuple[DemoEpisode, bool]:
        """Re-run a manifest record's try: ``(episode, same)`` where ``same`` says its digest
        and success equal the record's."""
        env = _demo_env(int(record["task"]), int(record["image_size"]), int(record["max_episode_steps"]))
        try:
            episode, success, _ = demonstrate(
                env,
                int(record["init_state"]),
                seed=int(record["seed"]),
                noise_std=float(record["noise_std"]),
                image_size=int(record["image_size"]),
                action_repeat=int(record["action_repeat"]),
                expert_style=record.get("expert_style", "phases"),
            )
        finally:
            env.close()
        return episode, episode_digest(episode) == record["digest"] and success == record["success"]


def load_libero_hdf5(
    path: str | Path, instruction: str, *, image_size: int | None = None, max_demos: int | None = None
) -> DemoDataset:
    """The original LIBERO HDF5 demonstrations (``data/demo_k/obs/{agentview_rgb,eye_in_hand_rgb,
    ee_pos,ee_ori,gripper_states}``, ``actions``) as a :class:`DemoDataset` (needs ``h5py``).

    LIBERO's HDF5 images are upside down (MuJoCo's convention); they are flipped upright here,
    like the env's observations. The end-effector orientation is stored as axis-angle, so the
    proprio quaternion slots hold ``(axis-angle, 0)``: train and act on the same source.
    """
    import h5py  # optional

    out = DemoDataset()
    with h5py.File(path, "r") as f:
        names = sorted(f["data"].keys(), key=lambda s: int(s.split("_")[-1]))
        for name in names[:max_demos]:
            g = f["data"][name]
            obs = g["obs"]
            av = np.asarray(obs["agentview_rgb"])[:, ::-1]
            wr = np.asarray(obs["eye_in_hand_rgb"])[:, ::-1]
            if image_size is not None and av.shape[1] != image_size:
                step = max(1, av.shape[1] // image_size)
                av, wr = av[:, ::step, ::step], wr[:, ::step, ::step]
            ori = np.asarray(obs["ee_ori"], np.float32)
            proprio = np.concatenate(
                [
                    np.asarray(obs["ee_pos"], np.float32),
                    ori,
                    np.zeros((len(ori), 1), np.float32),
                    np.asarray(obs["gripper_states"], np.float32),
                ],
                1,
            )
            out.episodes.append(
                DemoEpisode(
                    instruction,
                    np.ascontiguousarray(av),
                    np.ascontiguousarray(wr),
                    proprio,
                    np.asarray(g["actions"], np.float32),
                    {"source": str(path), "demo": name},
                )
            )
    return out


def merge(datasets: Sequence[DemoDataset]) -> DemoDataset:
    """One dataset with every episode of ``datasets``."""
    return DemoDataset([e for d in datasets for e in d.episodes])
