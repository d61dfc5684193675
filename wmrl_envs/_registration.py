"""Registers every wmrl env id with Gymnasium (called on ``import wmrl_envs``)."""

from __future__ import annotations

import importlib

__all__ = ["register_all"]

# Modules exposing ``register_envs()``; added here as env families land.
_FAMILIES = (
    "wmrl_envs.autoresearch.registration",
    "wmrl_envs.libero.registration",
    "wmrl_envs.remote",
)


def register_all() -> None:
    for name in _FAMILIES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name == name:  # family not built yet
                continue
            raise
        module.register_envs()
