"""Demonstrations for SFT: scripted-expert episodes on the real simulator, saved compressed.

:func:`collect_demos` runs :func:`~agents.vla.expert.run_expert` with DART noise on a
camera-enabled :class:`~wmrl_envs.libero.env.LiberoLongEnv` and keeps only the episodes the
*simulator* marks successful (``info["success"]`` of the graded final step). Goal-placer
episodes (:func:`wmrl_envs.libero.goals.achieve_goal`, which teleports objects) are never
demonstrations: nothing here calls it. :func:`load_libero_hdf5` reads the original LIBERO
HDF5 demonstrations instead (optional ``h5py``).

Classes: :class:`DemoEpisode`, :class:`DemoDataset`. Functions: :func:`collect_demos`,
:func:`load_libero_hdf5`.

>>> ep = DemoEpisode("open the drawer", np.zeros((3, 8, 8, 3), np.uint8), np.zeros((3, 8, 8, 3), np.uint8),
...                  np.zeros((3, 9), np.float32), np.zeros((3, 7), np.float32), {"task": 3})
>>> import tempfile, os
>>> path = DemoDataset([ep, ep]).save(os.path.join(tempfile.mkdtemp(), "demos.npz"))
>>> again = DemoDataset.load(path)
>>> len(again), again.frames, again.episodes[0].meta
(2, 6, {'task': 3})
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agents.vla.tokenizer import dataset_statistics

__all__ = ["DemoEpisode", "DemoDataset", "collect_demos", "load_libero_hdf5", "merge"]


@dataclass
class DemoEpisode:
    """One demonstration: per-step observations and the action taken on each.

    Attributes:
        instruction: language instruction.
        agentview / wrist: ``(T, S, S, 3)`` uint8 upright images.
        proprio: ``(T, 9)`` float32 (end-effector position, quaternion, fingers).
        actions: ``(T, 7)`` float32 env actions (the expert's clean labels).
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
        actions = np.concatenate([e.actions for e in self.episodes])
        proprio = np.concatenate([e.proprio for e in self.episodes])
        stats = dataset_statistics(actions, proprio)
        stats["num_trajectories"] = len(self.episodes)
        return stats


def collect_demos(
    task_id: int,
    init_states: Iterable[int],
    *,
    per_init: int = 1,
    noise_std: float = 0.15,
    image_size: int = 64,
    max_episode_steps: int = 600,
    seed: int = 0,
    action_repeat: int = 4,
    log: Any = print,
    save_to: str | Path | None = None,
) -> tuple[DemoDataset, list[dict[str, Any]]]:
    """Scripted-expert demonstrations of one task; returns the kept episodes and a record per try.

    Each try is ``(init_state, k)`` with seed ``seed + k``; only tries the simulator marks
    successful are kept. One recorded frame per decision (each held ``action_repeat`` env
    steps), its views the env's camera observations (the env renders every step; evaluate
    with ``env_cameras=True`` to show a policy the same kind of image).
    """
    from agents.vla.expert import ExpertConfig, run_expert
    from wmrl_envs.libero.env import LiberoLongEnv

    env = LiberoLongEnv(
        task_id=task_id, cameras=True, image_size=image_size, record_frames=False, max_episode_steps=max_episode_steps
    )
    dataset, records = DemoDataset(), []
    try:
        for init in init_states:
            for k in range(per_init):
                t0 = time.perf_counter()
                result = run_expert(
                    env,
                    init,
                    ExpertConfig(noise_std=noise_std),
                    seed=seed + k,
                    record=True,
                    action_repeat=action_repeat,
                    image_size=image_size,
                )
                rec = {
                    "task": task_id,
                    "init_state": int(init),
                    "try": k,
                    "success": result.success,
                    "steps": result.steps,
                    "seconds": round(time.perf_counter() - t0, 1),
                }
                records.append(rec)
                log(json.dumps(rec))
                if not result.success:
                    continue
                obs = result.observations
                dataset.episodes.append(
                    DemoEpisode(
                        env.task.instruction,
                        np.stack([o["agentview_image"] for o in obs]),
                        np.stack([o["wrist_image"] for o in obs]),
                        np.stack([o["proprio"] for o in obs]).astype(np.float32),
                        np.stack(result.actions).astype(np.float32),
                        {
                            "task": task_id,
                            "init_state": int(init),
                            "seed": seed + k,
                            "noise_std": noise_std,
                            "action_repeat": action_repeat,
                            "source": "scripted-expert",
                        },
                    )
                )
                if save_to is not None:
                    dataset.save(save_to)
    finally:
        env.close()
    return dataset, records


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
