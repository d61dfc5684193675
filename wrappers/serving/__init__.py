"""Serving a stack over the network: ``wmrl-serve``, an OpenEnv server (HTTP + WebSocket) for
any registered env behind a ``real`` / ``wm`` / ``wmrl`` stack, with one shared anchor and
calibration state for every session (checkpointed and restored).

Modules: :mod:`~wrappers.serving.app` (the FastAPI app, :class:`~wrappers.serving.app.ServerConfig`),
:mod:`~wrappers.serving.shared` (the shared stack state), :mod:`~wrappers.serving.session`
(one client session), :mod:`~wrappers.serving.models` (typed actions / observations),
:mod:`~wrappers.serving.cli` (the ``wmrl-serve`` command). Clients: ``gym.make("wmrl/Remote-v0",
url=...)`` (:mod:`wmrl_envs.remote`) and the TRL adapter (:mod:`agents.trl_adapter`).
"""
