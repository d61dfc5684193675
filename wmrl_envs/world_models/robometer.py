"""Robometer (the paper's video-language reward model) as a :class:`ProgressWorldModel`.

Robometer reads a video and an instruction and returns per-frame progress and a success
probability. Nothing is downloaded: the user points :class:`RobometerWorldModel` at a local
checkpoint directory (e.g. a copy of the Hugging Face repo ``aliangdw/Robometer-4B``). The
directory is checked up front and a missing piece is named in the error.

The network runs through the Robometer project's own inference code, which is not on PyPI:
give it as ``predictor``, a callable ``(checkpoint_dir, device) -> run`` where
``run(videos, instructions)`` takes a batch of ``(T, H, W, 3)`` uint8 videos and returns one
``(progress (T,), success_probability)`` pair per video. This adapter does the rest:
checkpoint checks, sub-sampling long episodes to ``max_frames`` (always keeping the last
frame), mapping progress back to every frame, output validation, batching.

Classes: :class:`RobometerWorldModel`. Functions: :func:`check_checkpoint_dir`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from wmrl_envs.world_models.progress import ProgressPrediction

__all__ = ["RobometerWorldModel", "check_checkpoint_dir", "Predictor"]

#: ``(videos, instructions) -> [(progress, success_probability), ...]``
Predictor = Callable[[Sequence[np.ndarray], Sequence[str]], Sequence[tuple[Any, float]]]

_WEIGHTS = ("*.safetensors", "pytorch_model*.bin")
_PROCESSOR = ("preprocessor_config.json", "tokenizer_config.json")


def check_checkpoint_dir(path: str | Path) -> Path:
    """Raise ``FileNotFoundError`` naming what a Robometer checkpoint directory lacks.

    A checkpoint needs ``config.json``, weights (``*.safetensors`` or ``pytorch_model*.bin``)
    and the processor files (``preprocessor_config.json``, ``tokenizer_config.json``).
    """
    path = Path(path).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(
            f"Robometer checkpoint directory {str(path)!r} does not exist; download the checkpoint "
            "(e.g. huggingface-cli download aliangdw/Robometer-4B --local-dir DIR) and pass DIR"
        )
    missing = [name for name in ("config.json",) + _PROCESSOR if not (path / name).is_file()]
    if not any(any(path.glob(pattern)) for pattern in _WEIGHTS):
        missing.append("model weights (" + " or ".join(_WEIGHTS) + ")")
    if missing:
        raise FileNotFoundError(f"Robometer checkpoint directory {str(path)!r} is missing: {', '.join(missing)}")
    return path


class RobometerWorldModel:
    """Robometer from a local checkpoint (``input_kind="frames"``).

    Args:
        checkpoint_dir: local directory of the checkpoint (checked by :func:`check_checkpoint_dir`).
        predictor: ``(checkpoint_dir, device) -> run`` building the network (see module doc).
        device: torch device string passed to ``predictor``. Default ``"cpu"``.
        max_frames: frames sent per episode (uniformly sub-sampled, last frame kept). Default 16.

    Usage (needs a local Robometer checkpoint, so not run as a doctest)::

        wm = ProgressOutcomeModel(RobometerWorldModel("~/ckpt/Robometer-4B", predictor=load_robometer))
    """

    input_kind = "frames"

    def __init__(
        self,
        checkpoint_dir: str | Path,
        predictor: Callable[[Path, str], Predictor] | None = None,
        *,
        device: str = "cpu",
        max_frames: int = 16,
    ):
        self.checkpoint_dir = check_checkpoint_dir(checkpoint_dir)
        if predictor is None:
            raise ValueError(
                "RobometerWorldModel needs predictor=: a callable (checkpoint_dir, device) -> run(videos, instructions) "
                "built on the Robometer inference code (github.com/aliang8/robometer), which is not on PyPI"
            )
        if max_frames < 2:
            raise ValueError(f"max_frames must be >= 2, got {max_frames}")
        self.device, self.max_frames = device, int(max_frames)
        self._run = predictor(self.checkpoint_dir, device)

    def _subsample(self, video: np.ndarray) -> np.ndarray:
        if len(video) <= self.max_frames:
            return np.arange(len(video))
        return np.unique(np.linspace(0, len(video) - 1, self.max_frames).round().astype(int))

    def predict_progress(
        self, episodes: Sequence[np.ndarray], instructions: Sequence[str]
    ) -> list[ProgressPrediction | None]:
        if len(episodes) != len(instructions):
            raise ValueError(f"predict_progress got {len(episodes)} episodes but {len(instructions)} instructions")
        videos, indices = [], []
        for i, video in enumerate(episodes):
            video = np.asarray(video)
            if video.ndim != 4 or video.shape[-1] != 3 or video.dtype != np.uint8 or len(video) == 0:
                raise ValueError(f"episodes[{i}] must be a (T, H, W, 3) uint8 video, got {video.dtype} {video.shape}")
            idx = self._subsample(video)
            videos.append(video[idx])
            indices.append((idx, len(video)))
        raw = list(self._run(videos, list(instructions)))
        if len(raw) != len(videos):
            raise RuntimeError(f"Robometer predictor returned {len(raw)} results for {len(videos)} videos")
        out: list[ProgressPrediction | None] = []
        for (idx, length), result in zip(indices, raw):
            if result is None:
                out.append(None)
                continue
            progress, p_success = result
            progress = np.asarray(progress, dtype=np.float64)
            if progress.shape != idx.shape or not np.all(np.isfinite(progress)):
                out.append(None)  # a malformed answer is unknown, not a guess
                continue
            full = np.interp(np.arange(length), idx, np.clip(progress, 0.0, 1.0))
            out.append(ProgressPrediction(full, float(np.clip(p_success, 0.0, 1.0))))
        return out
