"""Action tokenization of OpenVLA / MiniVLA: 256 bins per dimension, q01/q99 normalisation,
LIBERO gripper post-processing, and the optional residual-VQ action-chunk variant.

* :class:`ActionTokenizer` -- OpenVLA's binning: ``n_bins`` uniform bins on ``[-1, 1]``
  (``np.linspace(-1, 1, n_bins)`` edges, ``n_bins - 1`` centres), an action maps to the
  token ``vocab_size - np.digitize(a, bins)`` (the *last* ``n_bins`` ids of the vocabulary)
  and a token decodes to its bin centre. Round-trip error is at most half a bin, ``1/255``.
* :class:`ActionNormalizer` -- OpenVLA's ``BOUNDS_Q99`` normalisation with the statistics of a
  ``dataset_statistics.json`` file (``{dataset: {"action": {"q01", "q99", "mask", ...}}}``):
  ``2 (a - q01) / (q99 - q01) - 1`` clipped to ``[-1, 1]`` on masked dimensions (the gripper
  is left alone), and its inverse.
* :func:`postprocess_gripper` -- the gripper conventions: ``"openvla"`` (datasets whose gripper
  is in ``[0, 1]`` with 1 = open: map to ``[-1, 1]``, binarise, invert, as OpenVLA's LIBERO
  evaluation does) or ``"binarize"`` (already the env's -1 open / +1 close: take the sign).
* :class:`ResidualVQChunker` -- MiniVLA's VQ variant: a chunk of ``chunk`` consecutive
  normalised actions is flattened and coded by ``levels`` residual codebooks (k-means on the
  residuals) of ``codebook_size`` codes each; the codes are the tokens.

Classes: :class:`ActionTokenizer`, :class:`ActionNormalizer`, :class:`ResidualVQChunker`.
Functions: :func:`postprocess_gripper`, :func:`dataset_statistics`.

>>> tok = ActionTokenizer(vocab_size=1000)
>>> a = np.array([-1.0, -0.5, 0.0, 0.25, 0.999, 1.0, 0.3])
>>> ids = tok.encode(a)
>>> int(ids.min()) >= 1000 - 256, int(ids.max()) <= 999
(True, True)
>>> bool(np.abs(tok.decode(ids) - a).max() <= 1 / 255)
True
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

__all__ = [
    "ActionTokenizer",
    "ActionNormalizer",
    "ResidualVQChunker",
    "postprocess_gripper",
    "dataset_statistics",
    "GripperMode",
    "N_BINS",
    "ACTION_DIM",
]

#: Bins per action dimension (OpenVLA / MiniVLA).
N_BINS = 256
#: LIBERO's action: delta position (3), delta rotation (3), gripper (1).
ACTION_DIM = 7

GripperMode = Literal["openvla", "binarize", "none"]


class ActionTokenizer:
    """OpenVLA's uniform binning of ``[min_action, max_action]`` onto the last ``n_bins`` token ids.

    Args:
        vocab_size: size of the language model's vocabulary *including* the action tokens;
            action tokens are ids ``vocab_size - n_bins .. vocab_size - 1``.
        n_bins: number of bin edges (OpenVLA: 256, giving 255 distinct decoded values).
        min_action / max_action: the binned range (actions are clipped to it first).

    >>> tok = ActionTokenizer(vocab_size=300, n_bins=256)
    >>> tok.encode(np.array([-1.0, 1.0])).tolist(), tok.action_token_begin
    ([299, 44], 44)
    """

    def __init__(self, vocab_size: int, n_bins: int = N_BINS, min_action: float = -1.0, max_action: float = 1.0):
        if n_bins < 2 or vocab_size < n_bins:
            raise ValueError(f"need n_bins >= 2 and vocab_size >= n_bins, got {n_bins}, {vocab_size}")
        if not max_action > min_action:
            raise ValueError(f"max_action must exceed min_action, got {min_action}, {max_action}")
        self.vocab_size, self.n_bins = int(vocab_size), int(n_bins)
        self.min_action, self.max_action = float(min_action), float(max_action)
        self.bins = np.linspace(min_action, max_action, n_bins)
        self.bin_centers = (self.bins[:-1] + self.bins[1:]) / 2.0

    @property
    def action_token_begin(self) -> int:
        """The smallest action-token id (``vocab_size - n_bins``)."""
        return self.vocab_size - self.n_bins

    def encode(self, action: np.ndarray) -> np.ndarray:
        """Token ids of ``action`` (any shape; clipped to the range first), int64."""
        a = np.clip(np.asarray(action, dtype=np.float64), self.min_action, self.max_action)
        return (self.vocab_size - np.digitize(a, self.bins)).astype(np.int64)

    def decode(self, token_ids: np.ndarray) -> np.ndarray:
        """Bin centres of ``token_ids`` (float32); ids outside the action range clip to the ends."""
        discretized = self.vocab_size - np.asarray(token_ids, dtype=np.int64)
        index = np.clip(discretized - 1, 0, len(self.bin_centers) - 1)
        return self.bin_centers[index].astype(np.float32)

    def to_bins(self, token_ids: np.ndarray) -> np.ndarray:
        """Position ``0 .. n_bins - 1`` of each action token inside the action-token slice."""
        return np.asarray(token_ids, dtype=np.int64) - self.action_token_begin

    def from_bins(self, index: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`to_bins`."""
        return np.asarray(index, dtype=np.int64) + self.action_token_begin


def dataset_statistics(
    actions: np.ndarray, proprio: np.ndarray | None = None, mask: Sequence[bool] | None = None
) -> dict[str, Any]:
    """Statistics of ``(N, D)`` actions in the ``dataset_statistics.json`` format (one dataset).

    ``mask`` marks the dimensions to normalise (default: all but the last, the gripper).

    >>> s = dataset_statistics(np.linspace(-2, 2, 101)[:, None] * np.ones((1, 7)))
    >>> s["action"]["q01"][0], s["action"]["mask"][-1], s["num_transitions"]
    (-1.96, False, 101)
    """
    a = np.asarray(actions, dtype=np.float64)
    if a.ndim != 2 or len(a) == 0:
        raise ValueError(f"actions must be a non-empty (N, D) array, got shape {a.shape}")
    mask = list(mask) if mask is not None else [True] * (a.shape[1] - 1) + [False]

    def stats(x: np.ndarray) -> dict[str, list[float]]:
        return {
            "mean": x.mean(0).tolist(),
            "std": x.std(0).tolist(),
            "max": x.max(0).tolist(),
            "min": x.min(0).tolist(),
            "q01": np.quantile(x, 0.01, axis=0).tolist(),
            "q99": np.quantile(x, 0.99, axis=0).tolist(),
        }

    out: dict[str, Any] = {"action": {**stats(a), "mask": [bool(m) for m in mask]}, "num_transitions": int(len(a))}
    if proprio is not None:
        out["proprio"] = stats(np.asarray(proprio, dtype=np.float64))
    return out


class ActionNormalizer:
    """OpenVLA's ``BOUNDS_Q99`` action normalisation (``q01``/``q99`` per dimension, ``mask``).

    >>> n = ActionNormalizer(q01=[-0.5, 0.0], q99=[0.5, 2.0], mask=[True, False])
    >>> n.normalize(np.array([0.25, 0.75])).astype(float).round(4).tolist()
    [0.5, 0.75]
    >>> n.unnormalize(np.array([0.5, 0.75])).tolist()
    [0.25, 0.75]
    """

    def __init__(self, q01: Sequence[float], q99: Sequence[float], mask: Sequence[bool] | None = None):
        self.q01: np.ndarray = np.asarray(q01, dtype=np.float64)
        self.q99: np.ndarray = np.asarray(q99, dtype=np.float64)
        self.mask: np.ndarray = np.asarray(
            mask if mask is not None and len(mask) else [True] * len(self.q01), dtype=bool
        )
        if not (self.q01.shape == self.q99.shape == self.mask.shape) or self.q01.ndim != 1:
            raise ValueError(
                f"q01, q99, mask must be 1-D of one length, got {self.q01.shape}, {self.q99.shape}, {self.mask.shape}"
            )

    @classmethod
    def from_statistics(cls, stats: Mapping[str, Any], dataset: str | None = None) -> ActionNormalizer:
        """From a ``dataset_statistics.json`` mapping: ``{dataset: {"action": ...}}`` (pick
        ``dataset``, or the only one) or one dataset's entry ``{"action": ...}``."""
        if "action" not in stats:
            if dataset is None:
                if len(stats) != 1:
                    raise ValueError(f"statistics hold datasets {sorted(stats)}: name one with dataset=")
                dataset = next(iter(stats))
            if dataset not in stats:
                raise KeyError(f"no dataset {dataset!r} in the statistics (have {sorted(stats)})")
            stats = stats[dataset]
        a = stats["action"]
        return cls(a["q01"], a["q99"], a.get("mask", [True] * len(a["q01"])))

    @classmethod
    def load(cls, path: str | Path, dataset: str | None = None) -> ActionNormalizer:
        """From a ``dataset_statistics.json`` file."""
        return cls.from_statistics(json.loads(Path(path).read_text()), dataset)

    def normalize(self, action: np.ndarray) -> np.ndarray:
        a = np.asarray(action, dtype=np.float64)
        out = np.clip(2.0 * (a - self.q01) / (self.q99 - self.q01 + 1e-8) - 1.0, -1.0, 1.0)
        return np.where(self.mask, out, a).astype(np.float32)

    def unnormalize(self, action: np.ndarray) -> np.ndarray:
        a = np.asarray(action, dtype=np.float64)
        out = 0.5 * (a + 1.0) * (self.q99 - self.q01 + 1e-8) + self.q01
        return np.where(self.mask, out, a).astype(np.float32)


def postprocess_gripper(action: np.ndarray, mode: GripperMode = "binarize") -> np.ndarray:
    """The env's gripper command (-1 open, +1 close) from a decoded action's last dimension.

    ``"openvla"``: the dataset gripper is in ``[0, 1]`` with 1 = open (OpenVLA's LIBERO RLDS):
    ``2 g - 1``, binarised by sign, then inverted. ``"binarize"``: already -1 open / +1 close,
    binarised by sign (0 counts as open). ``"none"``: unchanged.

    >>> postprocess_gripper(np.array([[0.1, 0.9], [0.2, 0.1]]), "openvla")[:, -1].tolist()
    [-1.0, 1.0]
    >>> postprocess_gripper(np.array([0.0, -0.5, 0.5]), "binarize").tolist()
    [0.0, -0.5, 1.0]
    """
    a = np.array(action, dtype=np.float32, copy=True)
    g = a[..., -1]
    if mode == "openvla":
        g = 2.0 * g - 1.0
        a[..., -1] = -np.where(g > 0, 1.0, -1.0)
    elif mode == "binarize":
        a[..., -1] = np.where(g > 0, 1.0, -1.0)
    elif mode != "none":
        raise ValueError(f"gripper mode must be 'openvla', 'binarize' or 'none', got {mode!r}")
    return a


class ResidualVQChunker:
    """Residual vector quantisation of action chunks (MiniVLA's VQ action variant).

    A chunk is ``chunk`` consecutive normalised actions of ``dim`` dimensions, flattened. Level
    ``l`` quantises the residual left by levels ``0 .. l-1`` with its own codebook (k-means).
    ``encode`` gives ``levels`` codes per chunk; ``decode`` sums the chosen code vectors.

    Args:
        chunk: actions per chunk (MiniVLA: 8). dim: action dimensions.
        levels: residual codebooks. codebook_size: codes per codebook.
        iters: k-means iterations per level. seed: k-means initialisation seed.

    >>> rng = np.random.default_rng(0)
    >>> chunks = np.tanh(rng.normal(size=(400, 4, 2)).cumsum(1) * 0.3)
    >>> vq = ResidualVQChunker(chunk=4, dim=2, levels=3, codebook_size=16).fit(chunks)
    >>> codes = vq.encode(chunks)
    >>> codes.shape, bool(vq.error(chunks, levels=3) < vq.error(chunks, levels=1))
    ((400, 3), True)
    """

    def __init__(
        self,
        chunk: int = 8,
        dim: int = ACTION_DIM,
        levels: int = 4,
        codebook_size: int = 256,
        iters: int = 20,
        seed: int = 0,
    ):
        if min(chunk, dim, levels, codebook_size, iters) < 1:
            raise ValueError("chunk, dim, levels, codebook_size and iters must be >= 1")
        self.chunk, self.dim, self.levels, self.codebook_size = chunk, dim, levels, codebook_size
        self.iters, self.seed = iters, seed
        self.codebooks: np.ndarray | None = None  # (levels, codebook_size, chunk * dim)

    def _flat(self, chunks: np.ndarray) -> np.ndarray:
        x = np.asarray(chunks, dtype=np.float64)
        if x.shape[-2:] != (self.chunk, self.dim):
            raise ValueError(f"chunks must end in shape ({self.chunk}, {self.dim}), got {x.shape}")
        return x.reshape(-1, self.chunk * self.dim)

    @staticmethod
    def _nearest(x: np.ndarray, book: np.ndarray) -> np.ndarray:
        d = (x**2).sum(1, keepdims=True) - 2 * x @ book.T + (book**2).sum(1)[None]
        return d.argmin(1)

    def fit(self, chunks: np.ndarray) -> ResidualVQChunker:
        x = self._flat(chunks)
        rng = np.random.default_rng(self.seed)
        books = []
        residual = x.copy()
        for _ in range(self.levels):
            k = min(self.codebook_size, len(residual))
            book = residual[rng.choice(len(residual), k, replace=False)].copy()
            for _ in range(self.iters):
                assign = self._nearest(residual, book)
                for c in range(k):
                    members = residual[assign == c]
                    if len(members):
                        book[c] = members.mean(0)
            if k < self.codebook_size:
                book = np.concatenate([book, np.repeat(book[:1], self.codebook_size - k, 0)])
            books.append(book)
            residual = residual - book[self._nearest(residual, book)]
        self.codebooks = np.stack(books)
        return self

    def _books(self) -> np.ndarray:
        if self.codebooks is None:
            raise RuntimeError("ResidualVQChunker is not fitted: call fit()")
        return self.codebooks

    def encode(self, chunks: np.ndarray) -> np.ndarray:
        """``(N, levels)`` int64 codes of ``(N, chunk, dim)`` chunks."""
        residual = self._flat(chunks)
        codes = []
        for book in self._books():
            c = self._nearest(residual, book)
            codes.append(c)
            residual = residual - book[c]
        return np.stack(codes, 1).astype(np.int64)

    def decode(self, codes: np.ndarray, levels: int | None = None) -> np.ndarray:
        """``(N, chunk, dim)`` chunks from ``(N, levels)`` codes (the first ``levels`` only)."""
        codes = np.asarray(codes, dtype=np.int64)
        books = self._books()[: levels or self.levels]
        x = sum(book[codes[:, i]] for i, book in enumerate(books))
        return np.asarray(x, dtype=np.float32).reshape(-1, self.chunk, self.dim)

    def error(self, chunks: np.ndarray, levels: int | None = None) -> float:
        """Mean absolute reconstruction error using the first ``levels`` codebooks."""
        x = np.asarray(chunks, dtype=np.float64)
        return float(np.abs(self.decode(self.encode(x), levels) - x).mean())

    def state_dict(self) -> dict[str, Any]:
        return {
            "chunk": self.chunk,
            "dim": self.dim,
            "levels": self.levels,
            "codebook_size": self.codebook_size,
            "codebooks": self._books().tolist(),
        }

    @classmethod
    def from_state_dict(cls, d: Mapping[str, Any]) -> ResidualVQChunker:
        vq = cls(d["chunk"], d["dim"], d["levels"], d["codebook_size"])
        vq.codebooks = np.asarray(d["codebooks"], dtype=np.float64)
        return vq
