"""Supervised fine-tuning of a MiniVLA on demonstrations: token cross-entropy over the 7 action tokens.

The loss is the cross-entropy of each target action token under the same masked 256-token
distribution the policy samples from (temperature 1); ``token_acc`` is the share of action
tokens whose argmax is the target. Images get a random shift of up to ``shift`` pixels
(the augmentation small visuomotor policies need). Metrics go to ``metrics.jsonl`` and
TensorBoard in ``output_dir``; ``output_dir/checkpoint`` holds the model
(:meth:`MiniVLA.save`: ``config.json``, ``dataset_statistics.json``, ``model.pt``), the
optimiser and the step, and a run resumes from it. With ``eval_task`` set, the final policy
is rolled out closed-loop (greedy) on ``eval_init_states`` (held-out by default).

Classes: :class:`SFTConfig`. Functions: :func:`train_sft`, :func:`load_demos`, :func:`sample_batch`, :func:`action_chunk_at`.

Example (tiny; see ``tests/test_vla_agent.py``)::

    result = train_sft(SFTConfig(demos=("runs/vla/demos_task7.npz",), steps=2000, output_dir="runs/vla/sft"))
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from agents.vla.demos import DemoCache, DemoDataset
from agents.vla.model import MiniVLA, MiniVLAConfig

__all__ = ["SFTConfig", "train_sft", "load_demos", "sample_batch", "action_chunk_at"]


@dataclass
class SFTConfig:
    """Settings of ``python -m agents.vla sft``.

    Attributes:
        demos: demonstration files (``.npz``, e.g. from ``python -m agents.vla demos``).
        demo_cache: a demonstration cache directory (:class:`~agents.vla.demos.DemoCache`):
            every episode its manifest keeps (of ``demo_tasks``), added to ``demos``.
        demo_tasks: the tasks taken from ``demo_cache`` and ``dagger_dirs`` (empty: all).
        dagger_dirs: DAgger rounds (``python -m agents.vla dagger``): every episode their
            manifests keep (the policy's own states, labelled by the expert), added too.
        output_dir: where metrics, TensorBoard events and the checkpoint go.
        init_from: start from this MiniVLA checkpoint instead of a fresh model.
        steps: optimiser steps.
        batch_size: frames per step.
        learning_rate: AdamW peak learning rate (linear warm-up, cosine decay to 10%).
        weight_decay: AdamW weight decay.
        warmup_steps: warm-up steps.
        image_size / patch_size / width / llm_width / vision_layers / llm_layers: the model's
            shape (:meth:`MiniVLAConfig.tiny`).
        fuse_dino: add the DINOv2-with-registers branch (Prismatic's fused backbone).
        use_proprio: add the proprioception token.
        action_chunk: actions predicted per decision (:class:`MiniVLAConfig`); the target of a
            frame is then its own action and the next ``K - 1`` recorded ones (the last one
            repeated past the episode's end). A checkpoint it starts from keeps its own.
        shift: random image shift in pixels (0 = none).
        log_every: steps between metric lines.
        checkpoint_every: steps between checkpoints (the last step always saves).
        eval_task: task index for the closed-loop evaluation of the final policy (``None``: skip).
        eval_init_states: initial states of that evaluation (default: held-out 16-23).
        eval_max_steps: episode limit of the evaluation.
        action_repeat: env steps each decision is held for in the evaluation (as in the demos).
        seed: seed of initialisation and batch sampling.
        threads: torch CPU threads.
        device: torch device of the model (``"cpu"``, ``"cuda"``); the checkpoint is saved
            device-free (loads anywhere).
        tensorboard: write TensorBoard events.
        progress: show a progress bar.
    """

    demos: tuple[str, ...] = ()
    demo_cache: str | None = None
    demo_tasks: tuple[int, ...] = ()
    dagger_dirs: tuple[str, ...] = ()
    output_dir: str = "runs/vla/sft"
    init_from: str | None = None
    steps: int = 2000
    batch_size: int = 16
    learning_rate: float = 3e-4
    weight_decay: float = 0.01
    warmup_steps: int = 50
    image_size: int = 64
    patch_size: int = 16
    width: int = 192
    llm_width: int = 256
    vision_layers: int = 4
    llm_layers: int = 4
    fuse_dino: bool = False
    use_proprio: bool = True
    action_chunk: int = 1
    shift: int = 3
    log_every: int = 25
    checkpoint_every: int = 500
    eval_task: int | None = None
    eval_init_states: tuple[int, ...] = tuple(range(16, 24))
    eval_max_steps: int = 520
    action_repeat: int = 4
    seed: int = 0
    threads: int = 1
    device: str = "cpu"
    tensorboard: bool = True
    progress: bool = True

    def model_config(self) -> MiniVLAConfig:
        return MiniVLAConfig.tiny(
            image_size=self.image_size,
            patch_size=self.patch_size,
            width=self.width,
            llm_width=self.llm_width,
            vision_layers=self.vision_layers,
            llm_layers=self.llm_layers,
            fuse_dino=self.fuse_dino,
            use_proprio=self.use_proprio,
            action_chunk=self.action_chunk,
        )


def _shift(images: np.ndarray, pixels: int, rng: np.random.Generator) -> np.ndarray:
    if pixels <= 0:
        return images
    n, h, w, _ = images.shape
    padded = np.pad(images, ((0, 0), (pixels, pixels), (pixels, pixels), (0, 0)), mode="edge")
    dy, dx = rng.integers(0, 2 * pixels + 1, (2, n))
    return np.stack([padded[i, dy[i] : dy[i] + h, dx[i] : dx[i] + w] for i in range(n)])


def action_chunk_at(actions: np.ndarray, t: int, chunk: int) -> np.ndarray:
    """The ``(chunk, dim)`` actions from step ``t`` on, the last one repeated past the end.
    ``actions`` is ``(T, dim)``, or ``(T, K, dim)`` when each frame carries its own chunk of
    labels (DAgger frames), of which the first ``chunk`` are taken (the last one repeated).

    >>> action_chunk_at(np.arange(6).reshape(3, 2), 1, 3).tolist()
    [[2, 3], [4, 5], [4, 5]]
    >>> action_chunk_at(np.arange(8).reshape(2, 2, 2), 1, 3).tolist()
    [[4, 5], [6, 7], [6, 7]]
    """
    if actions.ndim == 3:
        own = actions[t]
        return own[np.minimum(np.arange(chunk), len(own) - 1)]
    index = np.minimum(np.arange(t, t + chunk), len(actions) - 1)
    return actions[index]


def sample_batch(
    data: DemoDataset, index: np.ndarray, rng: np.random.Generator, shift: int = 0, chunk: int = 1
) -> tuple[dict[str, Any], np.ndarray]:
    """Observations and target actions of frames ``index`` (``(n, 2)`` episode, step pairs):
    ``(n, 7)`` actions, or ``(n, chunk, 7)`` action chunks when ``chunk > 1``."""
    eps = [data.episodes[e] for e, _ in index]
    obs = {
        "agentview_image": _shift(np.stack([ep.agentview[t] for ep, (_, t) in zip(eps, index)]), shift, rng),
        "wrist_image": _shift(np.stack([ep.wrist[t] for ep, (_, t) in zip(eps, index)]), shift, rng),
        "proprio": np.stack([ep.proprio[t] for ep, (_, t) in zip(eps, index)]),
        "instruction": [ep.instruction for ep in eps],
    }
    if chunk == 1:
        return obs, np.stack([action_chunk_at(ep.actions, t, 1)[0] for ep, (_, t) in zip(eps, index)])
    return obs, np.stack([action_chunk_at(ep.actions, t, chunk) for ep, (_, t) in zip(eps, index)])


def _lr(step: int, config: SFTConfig) -> float:
    if step < config.warmup_steps:
        return config.learning_rate * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def load_demos(config: SFTConfig) -> DemoDataset:
    """The demonstrations a config names: its ``demos`` files and the kept episodes (of
    ``demo_tasks``) of its ``demo_cache`` and ``dagger_dirs``."""
    paths = [Path(p) for p in config.demos]
    for cache in ([config.demo_cache] if config.demo_cache else []) + list(config.dagger_dirs):
        paths += DemoCache(Path(cache)).paths(config.demo_tasks or None)
    return DemoDataset.load(*paths)


def train_sft(config: SFTConfig, data: DemoDataset | None = None) -> dict[str, Any]:
    """Run SFT; returns the final metrics (and ``closed_loop`` when ``eval_task`` is set)."""
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    data = data if data is not None else load_demos(config)
    if not len(data):
        raise ValueError("SFT needs at least one demonstration episode")
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / "checkpoint"
    start = 0
    if (ckpt / "trainer.json").is_file():
        model = MiniVLA.load(ckpt).train()
        start = int(json.loads((ckpt / "trainer.json").read_text())["step"])
    elif config.init_from:
        model = MiniVLA.load(config.init_from).train()
    else:
        model = MiniVLA(config.model_config(), data.statistics()).train()
    model.to(config.device)
    opt = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    if (ckpt / "optimizer.pt").is_file() and start:
        opt.load_state_dict(torch.load(ckpt / "optimizer.pt", map_location=config.device, weights_only=True))
    frames = np.array([(e, t) for e, ep in enumerate(data.episodes) for t in range(len(ep))])
    begin = model.action_tokenizer.action_token_begin
    jsonl = open(out / "metrics.jsonl", "a")
    tb = None
    if config.tensorboard:
        from torch.utils.tensorboard import SummaryWriter

        tb = SummaryWriter(str(out / "tb"))
    window: list[tuple[float, float]] = []
    last: dict[str, Any] = {}
    t_start = time.perf_counter()
    bar = tqdm(range(start, config.steps), initial=start, total=config.steps, desc="SFT", disable=not config.progress)
    try:
        for step in bar:
            for group in opt.param_groups:
                group["lr"] = _lr(step, config)
            obs, actions = sample_batch(
                data,
                frames[rng.integers(0, len(frames), config.batch_size)],
                rng,
                config.shift,
                model.config.action_chunk,
            )
            target = torch.as_tensor(model.encode_actions(actions), device=model.device)
            logits = model.action_logits(obs, target)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), (target - begin).reshape(-1))
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            acc = float((logits.argmax(-1) == (target - begin)).float().mean())
            window.append((float(loss.detach()), acc))
            if (step + 1) % config.log_every == 0 or step + 1 == config.steps:
                last = {
                    "step": step + 1,
                    "loss": float(np.mean([w[0] for w in window])),
                    "token_acc": float(np.mean([w[1] for w in window])),
                    "lr": _lr(step, config),
                    "samples_per_s": config.batch_size * len(window) / max(1e-9, time.perf_counter() - t_start),
                }
                window, t_start = [], time.perf_counter()
                jsonl.write(json.dumps(last) + "\n")
                jsonl.flush()
                if tb is not None:
                    for k, v in last.items():
                        if k != "step":
                            tb.add_scalar(f"sft/{k}", v, step + 1)
                bar.set_postfix(loss=f"{last['loss']:.3f}", acc=f"{last['token_acc']:.3f}")
            if (step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps:
                model.save(ckpt)
                torch.save(opt.state_dict(), ckpt / "optimizer.pt")
                (ckpt / "trainer.json").write_text(json.dumps({"step": step + 1, "config": asdict(config)}))
    finally:
        bar.close()
        jsonl.close()
        if tb is not None:
            tb.close()
    result: dict[str, Any] = {
        "final": last,
        "checkpoint": str(ckpt),
        "parameters": model.num_parameters(),
        "frames": len(frames),
        "episodes": len(data),
    }
    if config.eval_task is not None:
        from agents.vla.evaluate import evaluate_policy, policy_env

        model.eval()
        env = policy_env(config.eval_task, image_size=config.image_size, max_episode_steps=config.eval_max_steps)
        try:
            result["closed_loop"] = evaluate_policy(
                env,
                model,
                config.eval_init_states,
                trials=1,
                temperature=0.0,
                seed=config.seed,
                action_repeat=config.action_repeat,
                image_size=config.image_size,
            )
        finally:
            env.close()
    (out / "sft_result.json").write_text(json.dumps(result, indent=1))
    return result
