"""A progress world model learned on CPU from logged rollouts with privileged labels.

:class:`StateProgressModel` reads an episode's low-dimensional states (proprioception and
simulator joint positions per frame, :attr:`LiberoTrajectory.states`) and predicts
per-frame progress and the success probability. One pair of gradient-boosted trees per
instruction (scikit-learn ``HistGradientBoosting*``): a regressor of the privileged
progress label and a classifier of "the goal holds in this frame"; the episode's success
probability is the classifier on its last frame. Labels come from the simulator
(:func:`wmrl_envs.libero.goals.privileged_progress`); the model never sees them at
prediction time.

Data: :class:`ProgressDataset` (episodes with states, labels, instruction), saved as one
``.npz``. Fidelity on held-out episodes: :func:`progress_fidelity` (Pearson / Spearman of
per-frame progress against the privileged label, success AUC).

CLI::

    python -m wmrl_envs.world_models.progress_learned fit TRAIN.npz --eval HELDOUT.npz --out model.pkl

Classes: :class:`ProgressEpisode`, :class:`ProgressDataset`, :class:`StateProgressModel`.
Functions: :func:`progress_fidelity`.
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from wmrl_envs.world_models.progress import ProgressPrediction

__all__ = ["ProgressEpisode", "ProgressDataset", "StateProgressModel", "progress_fidelity"]

_FORMAT = "wmrl-progress-model/1"


@dataclass
class ProgressEpisode:
    """One logged episode with privileged labels.

    Attributes:
        instruction: the language instruction (the model's task key).
        states: ``(T, D)`` float32 per-frame states.
        progress: ``(T,)`` privileged progress label in [0, 1].
        goal_holds: ``(T,)`` bool, the simulator's success check per frame.
        meta: free-form (task id, init state, how the episode was produced).
    """

    instruction: str
    states: np.ndarray
    progress: np.ndarray
    goal_holds: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def success(self) -> bool:
        return bool(self.goal_holds[-1])


@dataclass
class ProgressDataset:
    """A list of :class:`ProgressEpisode` that saves to / loads from one ``.npz`` file."""

    episodes: list[ProgressEpisode] = field(default_factory=list)

    def save(self, path: str | Path) -> Path:
        arrays: dict[str, Any] = {}  # arrays; Any: mypy matches **arrays against savez's allow_pickle: bool
        header = []
        for i, ep in enumerate(self.episodes):
            arrays[f"states_{i}"] = np.asarray(ep.states, np.float32)
            arrays[f"progress_{i}"] = np.asarray(ep.progress, np.float32)
            arrays[f"goal_holds_{i}"] = np.asarray(ep.goal_holds, bool)
            header.append({"instruction": ep.instruction, "meta": ep.meta})
        arrays["header"] = np.array(json.dumps(header))
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(path, **arrays)
        return path

    @classmethod
    def load(cls, path: str | Path) -> ProgressDataset:
        with np.load(path, allow_pickle=False) as z:
            header = json.loads(str(z["header"]))
            return cls(
                [
                    ProgressEpisode(
                        h["instruction"], z[f"states_{i}"], z[f"progress_{i}"], z[f"goal_holds_{i}"], h["meta"]
                    )
                    for i, h in enumerate(header)
                ]
            )

    def __len__(self) -> int:
        return len(self.episodes)


class StateProgressModel:
    """Gradient-boosted progress and success model per instruction (``input_kind="states"``).

    Args:
        max_iter: boosting iterations per model. Default 60 (the shipped LIBERO model: 2.7 MB).
        max_leaf_nodes: leaves per tree. Default 31.
        learning_rate: boosting learning rate. Default 0.1.
        seed: random seed. Default 0.

    An instruction not seen in training gets ``None`` from :meth:`predict_progress`
    (unknown, never a guess). An instruction without successful training frames gets the
    final progress prediction as its success probability.

    >>> def episode(reach):  # a toy 2-d state moving towards (1, 1); success once it gets there
    ...     t = np.linspace(0.0, reach, 30)
    ...     return ProgressEpisode("stack the blocks", np.stack([t, t], 1), t, t >= 0.95)
    >>> model = StateProgressModel(max_iter=10).fit(ProgressDataset([episode(1.0), episode(0.5)]))
    >>> known, unseen = model.predict_progress([episode(1.0).states] * 2, ["stack the blocks", "open the drawer"])
    >>> known.progress.shape, unseen
    ((30,), None)
    """

    input_kind = "states"

    def __init__(self, max_iter: int = 60, max_leaf_nodes: int = 31, learning_rate: float = 0.1, seed: int = 0):
        self.params = {
            "max_iter": max_iter,
            "max_leaf_nodes": max_leaf_nodes,
            "learning_rate": learning_rate,
            "random_state": seed,
        }
        self.models: dict[str, tuple[Any, Any | None, int]] = {}
        self.info: dict[str, Any] = {}

    def fit(self, dataset: ProgressDataset) -> StateProgressModel:
        from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

        if not dataset.episodes:
            raise ValueError("cannot fit a StateProgressModel on an empty dataset")
        by_instruction: dict[str, list[ProgressEpisode]] = {}
        for ep in dataset.episodes:
            by_instruction.setdefault(ep.instruction, []).append(ep)
        for instruction, eps in by_instruction.items():
            dims = {ep.states.shape[1] for ep in eps}
            if len(dims) != 1:
                raise ValueError(f"episodes of {instruction!r} have different state sizes {sorted(dims)}")
            x = np.concatenate([ep.states for ep in eps])
            reg = HistGradientBoostingRegressor(**self.params).fit(x, np.concatenate([ep.progress for ep in eps]))
            y = np.concatenate([ep.goal_holds for ep in eps])
            clf = HistGradientBoostingClassifier(**self.params).fit(x, y) if 0 < y.sum() < len(y) else None
            self.models[instruction] = (reg, clf, dims.pop())
        self.info = {"episodes": len(dataset), "instructions": len(self.models), "params": self.params}
        return self

    def predict_progress(
        self, episodes: Sequence[np.ndarray], instructions: Sequence[str]
    ) -> list[ProgressPrediction | None]:
        if len(episodes) != len(instructions):
            raise ValueError(f"predict_progress got {len(episodes)} episodes but {len(instructions)} instructions")
        if not self.models:
            raise RuntimeError("StateProgressModel is not fitted: call fit() or load()")
        out: list[ProgressPrediction | None] = []
        for i, (states, instruction) in enumerate(zip(episodes, instructions)):
            if instruction not in self.models:
                out.append(None)
                continue
            reg, clf, dim = self.models[instruction]
            states = np.asarray(states, np.float32)
            if states.ndim != 2 or states.shape[1] != dim or len(states) == 0:
                raise ValueError(
                    f"episodes[{i}] must be a (T, {dim}) state array for {instruction!r}, got shape {states.shape}"
                )
            # One thread: per-tree OpenMP regions on a few hundred rows cost more than they
            # save, and stall badly when the simulator processes hold the cores.
            with threadpool_limits(1):
                progress = np.clip(reg.predict(states), 0.0, 1.0)
                p_success = float(clf.predict_proba(states[-1:])[0, 1]) if clf is not None else float(progress[-1])
            out.append(ProgressPrediction(progress, p_success))
        return out

    def save(self, path: str | Path) -> Path:
        """Pickle the model (load only files you trust: unpickling runs code)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as f:
            pickle.dump(
                {"format": _FORMAT, "params": self.params, "models": self.models, "info": self.info}, f, protocol=5
            )
        return path

    @classmethod
    def load(cls, path: str | Path) -> StateProgressModel:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no StateProgressModel file at {path}")
        with path.open("rb") as f:
            blob = pickle.load(f)
        if not isinstance(blob, dict) or blob.get("format") != _FORMAT:
            raise ValueError(f"{path} is not a {_FORMAT} file")
        model = cls()
        model.params, model.models, model.info = blob["params"], blob["models"], blob["info"]
        return model


def _auc(scores: np.ndarray, labels: np.ndarray) -> float | None:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(labels, scores)) if 0 < labels.sum() < len(labels) else None


def progress_fidelity(model: StateProgressModel, dataset: ProgressDataset) -> dict[str, Any]:
    """Fidelity of ``model`` on (held-out) labelled episodes.

    Returns ``episodes``, ``frames``, ``unknown`` (episodes the model could not read),
    ``pearson`` and ``spearman`` of per-frame predicted vs privileged progress,
    ``final_progress_mae``, and ``success_auc`` (episode success probability vs the
    simulator's success; ``None`` when the set has one class only).
    """
    from scipy.stats import pearsonr, spearmanr

    preds = model.predict_progress([ep.states for ep in dataset.episodes], [ep.instruction for ep in dataset.episodes])
    known = [(ep, p) for ep, p in zip(dataset.episodes, preds) if p is not None]
    if not known:
        raise ValueError("the model knows none of the dataset's instructions")
    y = np.concatenate([ep.progress for ep, _ in known])
    yhat = np.concatenate([p.progress for _, p in known])
    success = np.array([ep.success for ep, _ in known])
    return {
        "episodes": len(known),
        "frames": int(len(y)),
        "unknown": len(preds) - len(known),
        "pearson": float(pearsonr(y, yhat)[0]),
        "spearman": float(spearmanr(y, yhat)[0]),
        "final_progress_mae": float(np.mean([abs(ep.progress[-1] - p.progress[-1]) for ep, p in known])),
        "success_auc": _auc(np.array([p.success_probability for _, p in known]), success),
        "successes": int(success.sum()),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m wmrl_envs.world_models.progress_learned", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    fit = sub.add_parser("fit", help="fit on a ProgressDataset and save")
    fit.add_argument("train", help="training ProgressDataset (.npz)")
    fit.add_argument("--out", required=True, help="where to save the model (.pkl)")
    fit.add_argument("--eval", help="held-out ProgressDataset (.npz) to report fidelity on")
    fit.add_argument("--max-iter", type=int, default=60)
    ev = sub.add_parser("eval", help="report fidelity of a saved model")
    ev.add_argument("model")
    ev.add_argument("data")
    args = parser.parse_args(argv)
    if args.cmd == "fit":
        model = StateProgressModel(max_iter=args.max_iter).fit(ProgressDataset.load(args.train))
        if args.eval:
            model.info["fidelity"] = progress_fidelity(model, ProgressDataset.load(args.eval))
        model.save(args.out)
        print(json.dumps(model.info, indent=2))
    else:
        print(
            json.dumps(
                progress_fidelity(StateProgressModel.load(args.model), ProgressDataset.load(args.data)), indent=2
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
