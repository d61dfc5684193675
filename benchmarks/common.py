"""Shared plumbing of the experiments: config dataclasses <-> CLI flags / config files,
env stacks, policies, world models, per-seed aggregation and plotting.

Every experiment declares one config dataclass whose fields are its knobs (documented
defaults). :func:`add_config_arguments` turns each field into a ``--flag``;
:func:`build_config` reads a JSON or TOML config file (``--config``) and lets flags
override it, so a run is fully described by ``config.json`` in its run directory.

Classes: :class:`DropUnknownInfo`. Functions: :func:`add_config_arguments`, :func:`build_config`, :func:`load_config_file`,
:func:`config_to_dict`, :func:`task_split`, :func:`make_vector_env`, :func:`make_stack`,
:func:`load_world_model`, :func:`load_policy`, :func:`warm_start_plans`, :func:`summarize_seeds`, :func:`new_figure`,
:func:`save_figure`, :func:`cpu_clock`. Constants: :data:`ARMS`, :data:`CONFIG_DIR`, :data:`POLICIES`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import time
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Mapping, Sequence

import gymnasium as gym

from benchmarks.report import mean_spread

__all__ = [
    "ARMS",
    "DropUnknownInfo",
    "CONFIG_DIR",
    "add_config_arguments",
    "build_config",
    "load_config_file",
    "config_to_dict",
    "task_split",
    "make_vector_env",
    "make_stack",
    "load_world_model",
    "load_policy",
    "warm_start_plans",
    "POLICIES",
    "summarize_seeds",
    "new_figure",
    "save_figure",
    "cpu_clock",
]

#: Training arms of the speedup experiment: real execution, raw world model, WMRL.
ARMS = ("real", "wm", "wmrl")

#: Shipped config files (``--config main`` resolves to ``CONFIG_DIR / "main.toml"``).
CONFIG_DIR = Path(__file__).parent / "configs"


# ------------------------------------------------------------------ config <-> CLI
def _field_type(cls: type, f: dataclasses.Field) -> tuple[type, bool]:
    """``(scalar type, is_sequence)`` of a config field (``X | None`` -> X)."""
    hint = typing.get_type_hints(cls)[f.name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
        hint = args[0]
    if typing.get_origin(hint) in (tuple, list):
        inner = [a for a in typing.get_args(hint) if a is not Ellipsis]
        return (inner[0] if inner else str), True
    return hint, False


def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false), got {text!r}")


def _first_doc_line(cls: type, name: str) -> str:
    """The field's description from the class docstring (``name: text`` lines)."""
    for line in (cls.__doc__ or "").splitlines():
        stripped = line.strip()
        if stripped.startswith(f"{name}:"):
            return stripped[len(name) + 1 :].strip()
    return ""


def add_config_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """One ``--kebab-case`` flag per field of the dataclass ``cls`` (default: unset, so a
    config file's value is kept unless the flag is given). Sequences take several values;
    booleans take ``true``/``false``; ``none`` sets an optional field to ``None``."""
    group = parser.add_argument_group(f"{cls.__name__} (every knob; also settable in a --config file)")
    for f in dataclasses.fields(cls):
        scalar, many = _field_type(cls, f)
        convert = _parse_bool if scalar is bool else scalar
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        help_text = f"{_first_doc_line(cls, f.name)} (default: {default!r})".replace("%", "%%")
        group.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f"cfg_{f.name}",
            type=_none_or(convert),
            nargs="+" if many else None,
            default=argparse.SUPPRESS,
            help=help_text,
            metavar=scalar.__name__.upper() if hasattr(scalar, "__name__") else "VALUE",
        )


def _none_or(convert: Any) -> Any:
    def parse(text: str) -> Any:
        return None if text.strip().lower() == "none" else convert(text)

    parse.__name__ = getattr(convert, "__name__", "value")
    return parse


def load_config_file(path: str | Path) -> dict[str, Any]:
    """A JSON or TOML config file as a dict. A bare name is looked up in :data:`CONFIG_DIR`."""
    path = Path(path)
    if not path.exists() and not path.suffix and (CONFIG_DIR / f"{path}.toml").is_file():
        path = CONFIG_DIR / f"{path}.toml"
    if not path.is_file():
        shipped = sorted(p.stem for p in CONFIG_DIR.glob("*.toml"))
        raise FileNotFoundError(f"config file {str(path)!r} not found (shipped configs: {', '.join(shipped)})")
    if path.suffix == ".toml":
        return tomllib.loads(path.read_text())
    if path.suffix == ".json":
        return json.loads(path.read_text())
    raise ValueError(f"config file {path} must end in .toml or .json")


def build_config(cls: type, file_values: Mapping[str, Any] | None = None, args: argparse.Namespace | None = None) -> Any:
    """``cls(**defaults | file_values | flags)``; unknown keys in the file are an error; the
    string ``"none"`` in a file unsets an optional field (TOML has no null)."""
    names = {f.name for f in dataclasses.fields(cls)}
    values = dict(file_values or {})
    unknown = set(values) - names
    if unknown:
        raise ValueError(f"unknown {cls.__name__} settings {sorted(unknown)}; known: {sorted(names)}")
    hints = typing.get_type_hints(cls)
    for name, value in values.items():  # TOML has no null: "none" unsets an optional field
        if isinstance(value, str) and value.lower() == "none" and type(None) in typing.get_args(hints[name]):
            values[name] = None
    if args is not None:
        values.update({k[4:]: v for k, v in vars(args).items() if k.startswith("cfg_")})
    for f in dataclasses.fields(cls):
        if f.name in values and values[f.name] is not None and _field_type(cls, f)[1]:
            values[f.name] = tuple(values[f.name])
    return cls(**values)


def config_to_dict(config: Any) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(config).items()}


# ------------------------------------------------------------------ envs and stacks
def task_split(split: str, tasks: Sequence[str] | None = None, limit: int | None = None) -> list[str]:
    """Explicit ``tasks`` or the AutoResearch catalog's ``split`` ("train"/"test"), first ``limit``."""
    from wmrl_envs.autoresearch import catalog_split

    chosen = list(tasks) if tasks else list(catalog_split()[split])
    if not chosen:
        raise ValueError(f"no tasks in split {split!r}")
    return chosen[:limit] if limit else chosen


class DropUnknownInfo(gym.Wrapper):
    """Removes ``None``-valued keys from a sub-env's reset/step ``info``.

    Gymnasium's vector envs store each info key in an array typed by the first sub-env
    that reports it, so a ``None`` from a later sub-env either crashes (``int`` arrays, e.g.
    ``n_classes`` of a regression task next to a classification task) or silently becomes
    NaN (``float`` arrays, e.g. an unknown ``trajectory_reward``). Dropping the key instead
    leaves its ``_key`` mask False for that sub-env, which readers treat as unknown.
    """

    def reset(self, **kwargs: Any) -> Any:
        obs, info = self.env.reset(**kwargs)
        return obs, _known(info)

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, _known(info)


def _known(info: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in info.items() if v is not None}


def make_vector_env(split: str, num_envs: int, *, max_turns: int, wall_seconds: float, vectorization: str = "sync") -> Any:
    """``num_envs`` AutoResearch envs (same-step autoreset, real execution in the local sandbox)."""
    import wmrl_envs  # noqa: F401  (registers the env ids)

    if vectorization not in ("sync", "async"):
        raise ValueError(f"vectorization must be 'sync' or 'async', got {vectorization!r}")
    kwargs: dict[str, Any] = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
    if vectorization == "async":
        kwargs["shared_memory"] = False  # Text observations are stale with shared memory
    return gym.make_vec(
        "wmrl/AutoResearch-v0",
        num_envs=num_envs,
        vectorization_mode=vectorization,
        vector_kwargs=kwargs,
        split=split,
        max_turns=max_turns,
        wall_seconds=wall_seconds,
        wrappers=[DropUnknownInfo],
    )


def make_stack(arm: str, env: Any, world_model: Any, *, anchor_fraction: float, anchor_min_per_step: int, seed: int, calibration: Mapping[str, Any]) -> Any:
    """The env stack of a training arm: ``real`` (real execution), ``wm`` (raw world model),
    ``wmrl`` (world model + anchors + Online Debiasing + Inverse-Variance Denoising)."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; choose from {ARMS}")
    from wrappers import VectorAnchorWrapper, VectorCalibrationWrapper, VectorWorldModelWrapper

    # The real arm goes through the wrapper in "env" mode (real grading only) so that every
    # arm's real executions are counted by the same counter.
    env = VectorWorldModelWrapper(env, world_model, mode="env" if arm == "real" else "wm")
    if arm in ("real", "wm"):
        return env
    env = VectorAnchorWrapper(env, fraction=anchor_fraction, min_per_step=anchor_min_per_step, seed=seed)
    return VectorCalibrationWrapper(env, **calibration)


def load_world_model(spec: str) -> Any:
    """``"default"`` = the shipped fitted :class:`CodeOutcomeModel`; else a saved model directory."""
    from wmrl_envs.world_models import CodeOutcomeModel

    if spec == "default":
        try:
            return CodeOutcomeModel.load_default()
        except FileNotFoundError as err:
            raise FileNotFoundError(
                f"{err}. The speedup experiment needs a fitted world model: fit one with "
                "`wmrl-wm fit --logs <pool logs> --split train --out <dir>` and pass --world-model <dir>"
            ) from err
    return CodeOutcomeModel.load(spec)


#: Policies :func:`load_policy` knows.
POLICIES = ("default", "tiny", "tiny-plan")

def warm_start_plans(policy: Any, steps: int = 30, learning_rate: float = 1e-2) -> None:
    """Supervised warm start (:func:`agents.llm.trainer.warm_start`) on the agent CLI's
    demonstration plans over the catalog's train tasks, so a randomly initialised model
    writes plan-like text (valid, failing and malformed plans after sampling noise): a
    CPU-cheap stand-in that exercises every grading path."""
    from agents.llm.__main__ import WARM_START_REPLIES
    from agents.llm.scaffolds import PlanScaffold, TaskSpec
    from agents.llm.trainer import warm_start
    from wmrl_envs.autoresearch.tasks import get_task, list_catalog

    specs = [TaskSpec.from_info({**get_task(t).to_json(), **get_task(t).meta_features()}) for t in list_catalog("train")]
    warm_start(policy, PlanScaffold(), specs, WARM_START_REPLIES, steps=steps, learning_rate=learning_rate)


def load_policy(spec: str, checkpoint: str | None = None) -> Any:
    """``"default"`` (SmolLM2-135M-Instruct, offline), ``"tiny"`` (random from-config model) or
    ``"tiny-plan"`` (tiny, warm-started on demonstration plans: smoke runs and tests),
    optionally with the trainable weights of a trainer checkpoint directory."""
    from agents.llm.policy import LLMPolicy

    if spec not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {spec!r}")
    policy = LLMPolicy.default() if spec == "default" else LLMPolicy.tiny()
    if spec == "tiny-plan":
        warm_start_plans(policy)
    if checkpoint:
        import torch

        file = Path(checkpoint) / "policy.pt"
        if not file.is_file():
            raise FileNotFoundError(f"{checkpoint} is not a trainer checkpoint ({file.name} missing)")
        policy.load_trainable_state_dict(torch.load(file, weights_only=True))
        policy.sync_backend()
    return policy


# ------------------------------------------------------------------ aggregation, plots, clocks
def summarize_seeds(rows: Sequence[Mapping[str, Any]], key: str, metrics: Sequence[str]) -> list[dict[str, Any]]:
    """One row per value of ``key`` (first-seen order): ``metric`` = mean over seeds,
    ``metric_sd`` = sample standard deviation (``None`` values excluded), ``seeds`` = count."""
    out = []
    for value in dict.fromkeys(r[key] for r in rows):
        mine = [r for r in rows if r[key] == value]
        row: dict[str, Any] = {key: value, "seeds": len(mine)}
        for m in metrics:
            row[m], row[f"{m}_sd"] = mean_spread(r.get(m) for r in mine)
        out.append(row)
    return out


def new_figure(width: float = 6.0, height: float = 4.0, ncols: int = 1) -> tuple[Any, Any]:
    """A matplotlib figure (``ncols`` axes side by side) on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, ncols, figsize=(width, height), dpi=110)
    return fig, ax


def save_figure(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def cpu_clock() -> float:
    """CPU seconds of this process plus its finished children (sandbox runs are children)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime
