"""Checks of what a user typed, run before anything heavy loads: one line per mistake.

Every command line of the agent (``python -m agents.llm``) and the benchmarks that load
policies run these checks first, so a misspelt name fails in a second with a sentence that
says what was wrong and what is valid, instead of a traceback after a model has loaded (or
a failed connection to a model hub for a typo).

Classes: :class:`UsageError`. Functions: :func:`check_choice`, :func:`check_policy`,
:func:`check_tasks`, :func:`check_world_model`, :func:`resolve_checkpoint`,
:func:`saved_setup`.

>>> check_choice("--stack", "wmrl", ("real", "wm", "wmrl"))
'wmrl'
>>> check_choice("--stack", "wmlr", ("real", "wm", "wmrl"))
Traceback (most recent call last):
...
agents.llm.checks.UsageError: --stack 'wmlr' is not valid (did you mean 'wmrl'?); choose one of: real, wm, wmrl
>>> check_policy("tinny")
Traceback (most recent call last):
...
agents.llm.checks.UsageError: --policy 'tinny' is unknown (did you mean 'tiny'?); use default, tiny, tiny-plan, smollm2-135m-instruct, a local model directory, or a Hugging Face id like org/name
>>> check_tasks(["titanic"], split="train", flag="--tasks")
['titanic']
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "UsageError",
    "check_choice",
    "check_policy",
    "check_tasks",
    "check_world_model",
    "resolve_checkpoint",
    "saved_setup",
]


class UsageError(ValueError):
    """A mistake in what the user asked for; its message is one line naming what is valid."""


def _did_you_mean(value: str, valid: Iterable[str]) -> str:
    close = difflib.get_close_matches(value, list(valid), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_choice(flag: str, value: str, valid: Sequence[str]) -> str:
    """``value`` if it is one of ``valid``, else :class:`UsageError` naming the choices."""
    if value not in valid:
        raise UsageError(
            f"{flag} {value!r} is not valid{_did_you_mean(value, valid)}; choose one of: {', '.join(valid)}"
        )
    return value


def _in_hub_cache(name: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # transformers always brings it; without it nothing can load a hub name
        return False
    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except ValueError:  # not a valid repo id at all
        return False


def check_policy(spec: str, flag: str = "--policy") -> str:
    """A policy spec :func:`agents.llm.loading.load_policy` can load without guessing.

    Valid: a named policy (:data:`agents.llm.loading.POLICIES`), SmolLM2's name, an existing
    local model directory, a model already in the local Hugging Face cache, or an ``org/name``
    hub id (downloaded unless ``HF_HUB_OFFLINE`` is set). A bare word that is none of these is
    a typo, not a hub id: it is refused here rather than sent to the network.
    """
    from agents.llm.loading import POLICIES
    from wmrl_envs.smollm2 import NAME

    named = (*POLICIES, NAME)
    if spec in named:
        return spec
    path = Path(spec).expanduser()
    looks_like_path = spec.startswith((".", "/", "~")) or os.sep in spec and path.parent.exists()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UsageError(f"{flag} {spec!r} is a directory without config.json, not a saved model")
        return spec
    if _in_hub_cache(spec):
        return spec
    hub_id = spec.count("/") == 1 and not looks_like_path
    if hub_id and not os.environ.get("HF_HUB_OFFLINE"):
        return spec
    why = "is not a local directory" if looks_like_path else "is unknown"
    if hub_id:
        why = "is not in the local Hugging Face cache (HF_HUB_OFFLINE is set)"
    raise UsageError(
        f"{flag} {spec!r} {why}{_did_you_mean(spec, named)}; use {', '.join(named)}, a local model directory, "
        "or a Hugging Face id like org/name"
    )


def check_tasks(tasks: Sequence[str] | None, *, split: str | None, flag: str = "--tasks") -> list[str] | None:
    """The AutoResearch task ids (or task directories) in ``tasks``, each checked to exist and,
    with ``split``, to belong to that catalog split (training on held-out tasks, or reporting
    training tasks as held-out, is the slip this refuses). ``None`` passes through.
    """
    if tasks is None:
        return None
    from wmrl_envs.autoresearch.tasks import get_task, list_catalog

    catalog = list_catalog(tier=None)
    in_split = list_catalog(split, tier=None) if split else catalog
    out = []
    for name in tasks:
        if name not in catalog and not (Path(name) / "task.json").is_file():
            raise UsageError(
                f"{flag}: unknown task {name!r}{_did_you_mean(name, catalog)}; "
                f"{split or 'catalog'} tasks: {', '.join(in_split)} (or a task directory)"
            )
        task = get_task(name)
        if split is not None and task.split in ("train", "test") and task.split != split:
            raise UsageError(
                f"{flag}: {name!r} is a {task.split}-split task but {flag} takes {split}-split tasks: {', '.join(in_split)}"
            )
        out.append(name)
    if not out:
        raise UsageError(f"{flag} needs at least one task")
    return out


def check_world_model(spec: str, flag: str = "--world-model") -> str:
    """``"default"`` or a directory written by ``CodeOutcomeModel.save`` / ``wmrl-wm fit``."""
    if spec == "default":
        return spec
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise UsageError(
            f"{flag} {spec!r} is not a directory; use 'default' (the shipped model) or a directory written by `wmrl-wm fit`"
        )
    return spec


def resolve_checkpoint(path: str | Path, flag: str = "--checkpoint") -> Path:
    """The trainer checkpoint at ``path``: a checkpoint directory (``policy.pt``), or a run
    directory (``--output-dir`` of ``train``) holding one in ``checkpoint/``."""
    p = Path(path).expanduser()
    if (p / "policy.pt").is_file():
        return p
    if (p / "checkpoint" / "policy.pt").is_file():
        return p / "checkpoint"
    if not p.exists():
        raise UsageError(
            f"{flag} {str(path)!r} does not exist; pass a run directory (train --output-dir) or its checkpoint/"
        )
    raise UsageError(
        f"{flag} {str(path)!r} holds no policy.pt nor checkpoint/policy.pt; pass a run directory (train --output-dir) or its checkpoint/"
    )


def saved_setup(checkpoint: str | Path) -> dict[str, Any]:
    """What a checkpoint says about itself: ``trainer.json``'s ``step``, ``config`` and
    ``setup`` (policy, stack, scaffold, ... as saved by the CLI; empty for checkpoints written
    before it was recorded). ``{}`` when there is no ``trainer.json``."""
    file = Path(checkpoint) / "trainer.json"
    if not file.is_file():
        return {}
    return dict(json.loads(file.read_text()))
