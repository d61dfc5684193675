"""``wmrl-serve``: serve a registered env behind a ``real`` | ``wm`` | ``wmrl`` stack over OpenEnv.

Examples::

    wmrl-serve --env wmrl/AutoResearch-v0 --split train --tier full --stack wmrl --port 8000 \\
        --checkpoint runs/serve/state.json
    wmrl-serve --env wmrl/LIBERO-Long-v0 --env-kwargs '{"task_id": 0, "cameras": false}' --stack wm

Every :class:`~wrappers.serving.app.ServerConfig` field is a flag (``--max-sessions``,
``--sandbox-concurrency``, ...), the calibrator's settings are ``--calibration-*``, and
``--config FILE`` (TOML / JSON) sets them from a file. The server prints one line when it is
ready (``wmrl-serve: serving ... on http://HOST:PORT``) and stops cleanly on SIGINT / SIGTERM
(checkpoint written, sessions closed).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from wmrl_envs.config_cli import add_config_arguments, build_config, load_config_file, run_cli
from wrappers.calibration import CalibrationConfig
from wrappers.serving.app import ServerConfig

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="wmrl-serve",
        description="Serve a wmrl env behind its world-model stack as an OpenEnv server (HTTP + WebSocket).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--env", default="wmrl/AutoResearch-v0", help="registered env id to serve")
    parser.add_argument("--split", choices=("train", "test"), help="AutoResearch catalog split")
    parser.add_argument("--tier", choices=("small", "full"), help="AutoResearch catalog tier")
    parser.add_argument("--max-turns", type=int, help="AutoResearch turns per episode")
    parser.add_argument("--env-kwargs", default="{}", help="other gym.make keyword arguments, as JSON")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind")
    parser.add_argument("--port", type=int, default=8000, help="port to bind (0: any free port)")
    parser.add_argument("--config", help="TOML / JSON file of ServerConfig fields ([calibration] table)")
    parser.add_argument("--log-level", default="warning", help="uvicorn log level")
    add_config_arguments(parser, ServerConfig, skip=("env_id", "env_kwargs", "calibration"))
    add_config_arguments(parser, CalibrationConfig, section="calibration")
    return parser


def _config(args: argparse.Namespace) -> ServerConfig:
    values = load_config_file(args.config) if args.config else {}
    calibration = build_config(CalibrationConfig, values.pop("calibration", None), args, section="calibration")
    env_kwargs = dict(values.pop("env_kwargs", {}))
    env_kwargs.update(json.loads(args.env_kwargs))
    for key in ("split", "tier", "max_turns"):
        if getattr(args, key) is not None:
            env_kwargs[key] = getattr(args, key)
    config = build_config(ServerConfig, values, args)
    config.env_id = values.get("env_id", args.env) if args.env == "wmrl/AutoResearch-v0" else args.env
    config.env_kwargs = env_kwargs
    config.calibration = calibration
    return config


def serve(config: ServerConfig, host: str, port: int, log_level: str = "warning") -> None:
    """Run the server until SIGINT / SIGTERM (blocking)."""
    import socket

    import uvicorn

    from wrappers.serving.app import create_app

    app = create_app(config, announce=True)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)  # connections queue from now on: the "serving" line below is true when printed
    bound = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, log_level=log_level, ws_max_size=config.max_body_bytes, timeout_graceful_shutdown=5)
    )
    print(
        f"wmrl-serve: serving {config.env_id} ({config.stack} stack) on http://{host}:{bound}",
        flush=True,
    )
    server.run(sockets=[sock])


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        serve(_config(args), args.host, args.port, args.log_level)
        return 0

    return run_cli("wmrl-serve", body)


if __name__ == "__main__":
    sys.exit(main())
