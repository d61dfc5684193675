"""The ``wmrl-serve`` application: an OpenEnv server for any registered env behind a stack.

Routes (JSON everywhere; an error is ``{"error": <code>, "detail": <what was wrong>}`` with a 4xx
status for bad input, never a crash):

* OpenEnv's own: ``/ws`` (WebSocket sessions: ``{"type": "reset" | "step" | "state" | "close",
  "data": {...}}``, one session per connection), ``/schema``, ``/metadata``, ``/docs``;
* HTTP sessions on OpenEnv's paths: ``POST /reset`` (no ``session_id``: opens a session and
  returns its id), ``POST /step`` (``{"session_id", "action": {...}}``), ``GET /state?session_id=``,
  ``DELETE /sessions/{id}``; idle HTTP sessions expire after ``session_ttl_s``;
* ``POST /begin_step`` (``{"group_ids": [...]}``: a training step's groups, the calibration's step
  boundary; returns the anchor groups), ``GET /health``, ``GET /metrics`` (anchor share, pairs,
  map state, anchor weight, exploitation gap, counters, sessions, step latency),
  ``GET /spaces`` (the env's spaces, for remote clients), ``POST /checkpoint``.

One :class:`~wrappers.serving.shared.SharedStack` serves every session, so a GRPO group may
span sessions and one calibrator sees every anchor pair. With ``checkpoint`` set, its state is
written (atomically) whenever anchor pairs or a group result arrive, every
``checkpoint_every_s`` and at shutdown, and restored at start: a server killed mid-anchor
loses no pair it had received.

Classes: :class:`ServerConfig`, :class:`StackServer`. Functions: :func:`create_app`.

>>> from fastapi.testclient import TestClient
>>> config = ServerConfig(env_kwargs={"max_turns": 1}, stack="wm")
>>> with TestClient(create_app(config)) as client:
...     opened = client.post("/reset", json={"group_id": "g0", "group_size": 1}).json()
...     step = client.post("/step", json={"session_id": opened["session_id"], "action": {"text": "hi"}}).json()
...     bad = client.post("/step", json={"session_id": "nope", "action": {"text": "hi"}})
>>> step["done"], step["observation"]["info"]["outcome"]["status"], bad.status_code, bad.json()["error"]
(True, 'malformed', 404, 'unknown_session')
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from openenv.core.env_server.http_server import HTTPEnvServer
from pydantic import BaseModel, ConfigDict, Field, ValidationError

import wmrl_envs  # noqa: F401  (registers the env ids)
from wmrl_envs.wire import space_to_json
from wrappers.calibration import CalibrationConfig
from wrappers.serving.models import StackObservation, action_model
from wrappers.serving.session import ActionTooLarge, StackSession
from wrappers.serving.shared import SharedStack

__all__ = ["ServerConfig", "StackServer", "create_app"]


@dataclass
class ServerConfig:
    """Settings of ``wmrl-serve`` (every field is a CLI flag).

    Attributes:
        env_id: the registered env to serve (AutoResearch, or LIBERO: ``wmrl/LIBERO-Long-v0``).
        env_kwargs: keyword arguments of ``gym.make`` (AutoResearch: ``split``, ``tier``, ``max_turns``).
        stack: ``real`` | ``wm`` | ``wmrl``.
        world_model: ``"default"`` (the shipped model of the env family), a saved
            ``CodeOutcomeModel`` directory, or ``"none"`` (``real`` stack without counters).
        anchor_fraction / anchor_min_per_step / seed: the anchor scheduler's target share,
            per-step floor and seed (``wmrl`` only).
        calibration: the calibrator's settings (default: the paper's constants).
        max_sessions: sessions at once, WebSocket and HTTP together.
        session_ttl_s: an HTTP session idle this many seconds is closed (WebSocket sessions
            end with their connection).
        max_body_bytes: largest request body / WebSocket message accepted (413 above).
        max_action_chars: largest text action (default: the env's own action-space cap,
            AutoResearch 32,768 characters; 413 above).
        sandbox_concurrency: real executions at once across all sessions (the sandbox pool's
            cap; others wait for a slot). ``None``: no cap.
        checkpoint: JSON file of the shared stack state (written on new pairs, periodically and
            at shutdown; restored at start when it exists). ``None``: no checkpoints.
        checkpoint_every_s: period of the background checkpoint, in seconds.
        native_threads: threads of the native pools (OpenMP, BLAS) per call. The server's
            parallelism is its sessions: with more, concurrent world-model predictions from
            several threads oversubscribe the cores and spin (measured: 5.4 s per step instead
            of 90 ms with 4 stepping sessions on 2 cores). ``None``: the libraries' default.
        batch_predictions: world-model requests of sessions stepping at once are predicted
            together in one ``predict`` call (a request waits only for the prediction running
            when it arrives); false: one at a time.
    """

    env_id: str = "wmrl/AutoResearch-v0"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    stack: str = "wmrl"
    world_model: str = "default"
    anchor_fraction: float = 0.10
    anchor_min_per_step: int = 1
    seed: int = 0
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    max_sessions: int = 1024
    session_ttl_s: float = 900.0
    max_body_bytes: int = 1 << 20
    max_action_chars: int | None = None
    sandbox_concurrency: int | None = 2
    checkpoint: str | None = None
    checkpoint_every_s: float = 30.0
    native_threads: int | None = 1
    batch_predictions: bool = True


def load_world_model(env_id: str, spec: str) -> Any:
    """The world model named by ``spec`` for ``env_id`` (``None`` for ``"none"``)."""
    if spec == "none":
        return None
    if "LIBERO" in env_id:
        from wmrl_envs.world_models.progress import ProgressOutcomeModel
        from wmrl_envs.world_models.progress_learned import StateProgressModel
        from wmrl_envs.world_models.progress_rollouts import DEFAULT_PROGRESS_MODEL

        path = DEFAULT_PROGRESS_MODEL if spec == "default" else spec
        return ProgressOutcomeModel(StateProgressModel.load(path), mode="potential")
    from wmrl_envs.world_models import CodeOutcomeModel

    return CodeOutcomeModel.load_default() if spec == "default" else CodeOutcomeModel.load(spec)


class _CappedExecutor:
    """The sandbox shared by every session, at most ``cap`` real runs at once."""

    def __init__(self, executor: Any, cap: int) -> None:
        self.executor = executor
        self._slots = threading.BoundedSemaphore(cap)

    def run(self, script: str, **kwargs: Any) -> Any:
        with self._slots:
            return self.executor.run(script, **kwargs)


class StackServer:
    """The server's state: config, shared stack, HTTP sessions, checkpoints, step latencies."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        if config.native_threads is not None:
            from threadpoolctl import threadpool_limits

            threadpool_limits(config.native_threads)  # process-wide, for every session thread
        wm = load_world_model(config.env_id, config.world_model)
        self.shared = SharedStack(
            config.stack,
            wm,
            anchor_fraction=config.anchor_fraction,
            anchor_min_per_step=config.anchor_min_per_step,
            seed=config.seed,
            calibration=config.calibration,
            on_pairs=self.save_checkpoint,
            batch_predictions=config.batch_predictions,
        )
        self._executor: Any = None
        if config.sandbox_concurrency is not None and config.env_id.startswith("wmrl/AutoResearch"):
            from wmrl_envs.sandbox import default_executor

            self._executor = _CappedExecutor(default_executor(), config.sandbox_concurrency)
        probe = self.make_env()
        self.spaces = {
            "action": space_to_json(probe.action_space),
            "observation": space_to_json(probe.observation_space),
        }
        cap = getattr(probe.action_space, "max_length", None)
        probe.close()
        self.max_action_chars = int(config.max_action_chars or cap or config.max_body_bytes)
        self.action_cls = action_model(self.spaces["action"])
        self.http_sessions: dict[str, StackSession] = {}
        self.latencies: deque[float] = deque(maxlen=10_000)
        self.steps = 0
        self.restored_pairs = 0
        self._save_lock = threading.Lock()
        if config.checkpoint and Path(config.checkpoint).is_file():
            self.shared.load_state_dict(json.loads(Path(config.checkpoint).read_text()))
            self.restored_pairs = int(self.shared.metrics().get("anchor_pairs_total", 0))

    def make_env(self) -> Any:
        kwargs = dict(self.config.env_kwargs)
        if self._executor is not None:
            kwargs.setdefault("executor", self._executor)
        return gym.make(self.config.env_id, disable_env_checker=True, **kwargs)

    def session_factory(self) -> Any:
        return functools.partial(
            StackSession, self.shared, self.make_env, self.max_action_chars, self.config.env_id, self.record_step
        )

    def record_step(self, seconds: float) -> None:
        self.latencies.append(seconds)
        self.steps += 1

    # -- sessions ---------------------------------------------------------------------------
    @property
    def sessions(self) -> int:
        return self.shared.sessions

    def open_session(self) -> tuple[str, StackSession]:
        if self.sessions >= self.config.max_sessions:
            raise _Refused(429, "capacity", f"the server holds max_sessions={self.config.max_sessions} sessions")
        sid = uuid.uuid4().hex
        session = self.session_factory()()
        self.http_sessions[sid] = session
        return sid, session

    def get_session(self, sid: Any) -> StackSession:
        session = self.http_sessions.get(sid) if isinstance(sid, str) else None
        if session is None:
            raise _Refused(404, "unknown_session", f"no open session {sid!r} (closed, expired or never opened)")
        return session

    def close_session(self, sid: str) -> None:
        session = self.http_sessions.pop(sid, None)
        if session is not None:
            session.close()

    def expire_idle(self) -> int:
        now = time.monotonic()
        stale = [sid for sid, s in self.http_sessions.items() if now - s.last_active > self.config.session_ttl_s]
        for sid in stale:
            self.close_session(sid)
        return len(stale)

    # -- checkpoints ------------------------------------------------------------------------
    def save_checkpoint(self) -> None:
        """Write the shared state atomically (temp file + rename: a kill never leaves half a file)."""
        if not self.config.checkpoint:
            return
        with self._save_lock:
            path = Path(self.config.checkpoint)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.shared.state_dict()))
            os.replace(tmp, path)

    def metrics(self) -> dict[str, Any]:
        lat = sorted(self.latencies)

        def pct(q: float) -> float | None:
            return lat[min(len(lat) - 1, int(q * len(lat)))] if lat else None

        return {
            **self.shared.metrics(),
            "env_id": self.config.env_id,
            "http_sessions": len(self.http_sessions),
            "steps": self.steps,
            "step_latency_s": {"p50": pct(0.50), "p99": pct(0.99), "n": len(lat)},  # inside the stack
            "restored_pairs": self.restored_pairs,
            "max_action_chars": self.max_action_chars,
            "checkpoint": self.config.checkpoint,
        }

    def close(self) -> None:
        for sid in list(self.http_sessions):
            self.close_session(sid)
        self.save_checkpoint()


class _Refused(Exception):
    """A request refused with a 4xx JSON answer."""

    def __init__(self, status: int, code: str, detail: Any) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail


def _error(status: int, code: str, detail: Any) -> JSONResponse:
    return JSONResponse({"error": code, "detail": detail}, status_code=status)


class _HTTPReset(BaseModel):
    model_config = ConfigDict(extra="forbid")
    session_id: str | None = None
    seed: int | None = Field(default=None, ge=0)
    episode_id: str | None = Field(default=None, max_length=255)
    group_id: int | str | None = None
    group_size: int | None = Field(default=None, ge=1)
    task: str | None = None
    options: dict[str, Any] | None = None


class _HTTPStep(BaseModel):
    model_config = ConfigDict(extra="forbid")
    session_id: str
    action: dict[str, Any]
    timeout_s: float | None = None
    request_id: str | None = None


class _BeginStep(BaseModel):
    model_config = ConfigDict(extra="forbid")
    group_ids: list[int | str] = Field(max_length=100_000)


def _payload(session_id: str, obs: StackObservation) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "observation": obs.model_dump(exclude={"reward", "done", "metadata"}),
        "reward": obs.reward,
        "done": obs.done,
    }


def create_app(
    config: ServerConfig | None = None, server: StackServer | None = None, *, announce: bool = False
) -> FastAPI:
    """The FastAPI app serving ``config`` (or an already built ``server``); see the module
    docstring. ``announce``: print one line when it stops (the CLI's)."""
    server = server or StackServer(config or ServerConfig())
    cfg = server.config
    app = FastAPI(title=f"wmrl-serve: {cfg.env_id} ({cfg.stack} stack)", lifespan=_lifespan(server, announce))
    app.state.server = server
    _add_error_handling(app, cfg.max_body_bytes)
    _add_session_routes(app, server)
    _add_service_routes(app, server)
    # OpenEnv's routes after ours: ours answer /reset, /step, /state, /health with sessions;
    # OpenEnv adds the WebSocket sessions (/ws), /schema, /metadata and MCP.
    openenv = HTTPEnvServer(
        server.session_factory(), server.action_cls, StackObservation, max_concurrent_envs=cfg.max_sessions
    )
    openenv.register_routes(app)
    app.state.openenv = openenv
    return app


def _lifespan(server: StackServer, announce: bool) -> Any:
    cfg = server.config

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async def housekeeping() -> None:
            while True:
                await asyncio.sleep(min(cfg.checkpoint_every_s, max(1.0, cfg.session_ttl_s / 4)))
                await run_in_threadpool(server.expire_idle)
                await run_in_threadpool(server.save_checkpoint)

        task = asyncio.create_task(housekeeping())
        try:
            yield
        finally:
            task.cancel()
            await run_in_threadpool(server.close)
            if announce:
                print(f"wmrl-serve: stopped ({server.sessions} sessions left, checkpoint {cfg.checkpoint})", flush=True)

    return lifespan


def _add_error_handling(app: FastAPI, max_body_bytes: int) -> None:
    @app.exception_handler(_Refused)
    async def refused(_: Request, err: _Refused) -> JSONResponse:
        return _error(err.status, err.code, err.detail)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        errors = [{k: e[k] for k in ("loc", "msg", "type") if k in e} for e in err.errors()]
        return _error(422, "invalid_request", errors)

    @app.middleware("http")
    async def body_cap(request: Request, call_next: Any) -> Any:
        # Refuse oversized bodies before reading them (a Content-Length over the cap), and
        # chunked bodies that turn out larger than the cap.
        too_large = _error(413, "body_too_large", f"request body over max_body_bytes={max_body_bytes}")
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > max_body_bytes):
            return too_large
        if request.method in ("POST", "PUT") and length is None and len(await request.body()) > max_body_bytes:
            return too_large
        return await call_next(request)


async def _run(session: StackSession, fn: Any, *args: Any, **kwargs: Any) -> StackObservation:
    """``fn`` in a worker thread, one call per session at a time, its errors as 4xx answers."""
    if not session.lock.acquire(blocking=False):
        raise _Refused(409, "session_busy", "this session is already handling a request")
    try:
        return await run_in_threadpool(fn, *args, **kwargs)
    except ActionTooLarge as err:
        raise _Refused(413, "action_too_large", str(err)) from None
    except (ValueError, TypeError, KeyError) as err:
        raise _Refused(422, "invalid_action_or_options", f"{type(err).__name__}: {err}") from None
    except RuntimeError as err:  # e.g. a step after the episode ended
        raise _Refused(409, "episode_state", str(err)) from None
    finally:
        session.lock.release()


def _add_session_routes(app: FastAPI, server: StackServer) -> None:
    @app.post("/reset", tags=["Environment Control"])
    async def reset(body: _HTTPReset | None = None) -> dict[str, Any]:
        body = body or _HTTPReset()
        if body.session_id is None:
            sid, session = await run_in_threadpool(server.open_session)
        else:
            sid, session = body.session_id, server.get_session(body.session_id)
        kwargs = body.model_dump(exclude={"session_id"}, exclude_none=True)
        try:
            return _payload(sid, await _run(session, session.reset, **kwargs))
        except _Refused:
            if body.session_id is None:  # a session opened for a refused reset is not left behind
                await run_in_threadpool(server.close_session, sid)
            raise

    @app.post("/step", tags=["Environment Control"])
    async def step(body: _HTTPStep) -> dict[str, Any]:
        session = server.get_session(body.session_id)
        try:
            action = server.action_cls.model_validate(body.action)
        except ValidationError as err:
            errors = [{k: e[k] for k in ("loc", "msg", "type") if k in e} for e in err.errors()]
            raise _Refused(422, "invalid_action", errors) from None
        obs = await _run(session, session.step, action)
        return _payload(body.session_id, obs)

    @app.get("/state", tags=["State Management"])
    async def state(session_id: str) -> dict[str, Any]:
        return server.get_session(session_id).state.model_dump()

    @app.delete("/sessions/{session_id}")
    async def close(session_id: str) -> dict[str, Any]:
        server.get_session(session_id)
        await run_in_threadpool(server.close_session, session_id)
        return {"session_id": session_id, "closed": True}


def _add_service_routes(app: FastAPI, server: StackServer) -> None:
    cfg = server.config

    @app.post("/begin_step")
    async def begin_step(body: _BeginStep) -> dict[str, Any]:
        anchors = await run_in_threadpool(server.shared.begin_step, body.group_ids)
        return {"anchors": sorted(anchors, key=str)}

    @app.get("/health", tags=["Health"])
    async def health() -> dict[str, Any]:
        return {"status": "healthy", "env_id": cfg.env_id, "stack": cfg.stack, "sessions": server.sessions}

    @app.get("/metrics")
    async def metrics() -> dict[str, Any]:
        return await run_in_threadpool(server.metrics)

    @app.get("/spaces")
    async def spaces() -> dict[str, Any]:
        return {**server.spaces, "max_action_chars": server.max_action_chars, "stack": cfg.stack}

    @app.post("/checkpoint")
    async def checkpoint() -> dict[str, Any]:
        if not cfg.checkpoint:
            raise _Refused(409, "no_checkpoint", "the server runs without --checkpoint")
        await run_in_threadpool(server.save_checkpoint)
        return {"checkpoint": cfg.checkpoint}


def config_from_dict(d: dict[str, Any]) -> ServerConfig:
    """A :class:`ServerConfig` from plain values (``calibration`` as a dict)."""
    d = dict(d)
    if isinstance(d.get("calibration"), dict):
        d["calibration"] = CalibrationConfig(**d["calibration"])
    names = {f.name for f in dataclasses.fields(ServerConfig)}
    unknown = set(d) - names
    if unknown:
        raise TypeError(f"unknown ServerConfig fields {sorted(unknown)}")
    return ServerConfig(**d)
