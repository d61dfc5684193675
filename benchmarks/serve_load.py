"""serve-load: sessions held and steps served by ``wmrl-serve`` on loopback, vs the in-process stack.

What it measures (one ``wmrl-serve`` subprocess on 127.0.0.1, OpenEnv WebSocket sessions):

* **idle sessions**: ``idle_sessions`` WebSocket sessions opened and reset, then all held at
  once (the server's ``/metrics`` must count every one); time to open them and the server's
  resident memory with them held;
* **stepping sessions**: ``stepping_sessions`` sessions in parallel client threads, each playing
  ``episodes`` one-turn episodes (reset + one step with a complete script the world model
  grades); steps/s over the whole run and the client-side round trip of a step (p50 / p99);
* **in-process**: the same episodes on ``build_stack(gym.make(...), stack, world_model)`` in
  this process (one env, no transport): steps/s and a step's p50 / p99.

The request loops are bounded (counts above) and the server is stopped at the end.

Functions: :func:`run`. Config: :class:`ServeLoadConfig`.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.report import write_json

__all__ = ["ServeLoadConfig", "CONFIG", "run"]

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class ServeLoadConfig:
    """Settings of the load benchmark.

    Attributes:
        stack: the served stack (``wm``: every step graded by the world model).
        tier: AutoResearch catalog tier of the served env.
        task: the task every episode plays (its reference ``majority`` script is the action).
        idle_sessions: WebSocket sessions opened and held at once.
        stepping_sessions: sessions stepping in parallel.
        episodes: one-turn episodes per stepping session.
        in_process_episodes: episodes of the in-process baseline.
        batch_predictions: the server predicts concurrent sessions' requests in one batch
            (``wmrl-serve --batch-predictions``); false: one at a time, as before batching.
    """

    stack: str = "wm"
    tier: str = "small"
    task: str = "titanic"
    idle_sessions: int = 256
    stepping_sessions: int = 64
    episodes: int = 4
    in_process_episodes: int = 128
    batch_predictions: bool = True


CONFIG = ServeLoadConfig


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class _Server:
    def __init__(self, config: ServeLoadConfig) -> None:
        cmd = [sys.executable, "-m", "wrappers.serving.cli", "--port", "0", "--max-turns", "1"]
        cmd += ["--stack", config.stack, "--tier", config.tier, "--max-sessions", str(4 * config.idle_sessions)]
        cmd += ["--batch-predictions", str(config.batch_predictions).lower()]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert self.proc.stdout is not None
        line = ""
        while "serving" not in line:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("wmrl-serve did not start")
        self.url = line.strip().rsplit(" ", 1)[-1]
        self.ws_url = self.url.replace("http://", "ws://") + "/ws"
        # drain the server's output (a full pipe would block the server), keep its tail
        self.output: list[str] = []
        threading.Thread(target=lambda: self.output.extend(self.proc.stdout or ()), daemon=True).start()

    def metrics(self) -> dict[str, Any]:
        import urllib.request

        with urllib.request.urlopen(self.url + "/metrics", timeout=60) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _call(ws: Any, kind: str, data: dict[str, Any]) -> dict[str, Any]:
    ws.send(json.dumps({"type": kind, "data": data}))
    answer = json.loads(ws.recv(timeout=600))
    if answer.get("type") != "observation":
        raise RuntimeError(f"{kind} failed: {answer}")
    return answer["data"]


def _warm_up(server: _Server, config: ServeLoadConfig, action: str) -> None:
    """One episode first: the world model's per-task features are computed once per process
    (~1 s), which is start-up cost, not a step's."""
    from websockets.sync.client import connect

    with connect(server.ws_url, max_size=None, proxy=None, open_timeout=120) as ws:
        _call(ws, "reset", {"group_id": "warm-up", "group_size": 1, "task": config.task})
        _call(ws, "step", {"text": action})


def _idle(server: _Server, config: ServeLoadConfig) -> dict[str, Any]:
    from websockets.sync.client import connect

    conns = []
    t0 = time.perf_counter()
    try:
        for i in range(config.idle_sessions):
            ws = connect(server.ws_url, max_size=None, proxy=None, open_timeout=120)
            conns.append(ws)
            _call(ws, "reset", {"group_id": f"idle-{i}", "group_size": 1, "task": config.task})
        opened = time.perf_counter() - t0
        held = server.metrics()["sessions"]
        rss = _rss_mb(server.proc.pid)
    finally:
        for ws in conns:
            ws.close()
    return {"sessions": config.idle_sessions, "held": held, "open_s": opened, "server_rss_mb": rss}


def _stepping(server: _Server, config: ServeLoadConfig, action: str) -> dict[str, Any]:
    from websockets.sync.client import connect

    latencies: list[float] = []
    sources: list[str] = []
    errors: list[str] = []
    lock = threading.Lock()
    ready = threading.Barrier(config.stepping_sessions + 1)

    def client(k: int) -> None:
        try:
            with connect(server.ws_url, max_size=None, proxy=None, open_timeout=120) as ws:
                ready.wait()
                for e in range(config.episodes):
                    _call(ws, "reset", {"group_id": f"s{k}-{e}", "group_size": 1, "task": config.task})
                    t0 = time.perf_counter()
                    data = _call(ws, "step", {"text": action})
                    with lock:
                        latencies.append(time.perf_counter() - t0)
                        sources.append(data["observation"]["info"].get("source", "?"))
        except Exception as err:  # reported in the table, not swallowed
            with lock:
                errors.append(f"{type(err).__name__}: {err}")

    threads = [threading.Thread(target=client, args=(k,)) for k in range(config.stepping_sessions)]
    for t in threads:
        t.start()
    ready.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {
        "sessions": config.stepping_sessions,
        "steps": len(latencies),
        "wall_s": wall,
        "steps_per_s": len(latencies) / wall,
        "p50_s": _pct(latencies, 0.5),
        "p99_s": _pct(latencies, 0.99),
        "wm_graded": sources.count("wm"),
        "errors": errors[:5],
    }


def _in_process(config: ServeLoadConfig, action: str) -> dict[str, Any]:
    import gymnasium as gym

    import wmrl_envs  # noqa: F401
    from wmrl_envs.world_models import CodeOutcomeModel
    from wrappers import build_stack

    env = build_stack(
        gym.make("wmrl/AutoResearch-v0", tier=config.tier, max_turns=1, disable_env_checker=True),
        config.stack,
        CodeOutcomeModel.load_default(),
    )
    env.reset(options={"group_id": "warm-up", "group_size": 1, "task": config.task})
    env.step(action)  # the same warm-up as the server's
    latencies = []
    t_all = time.perf_counter()
    for e in range(config.in_process_episodes):
        env.reset(options={"group_id": f"p{e}", "group_size": 1, "task": config.task})
        t0 = time.perf_counter()
        env.step(action)
        latencies.append(time.perf_counter() - t0)
    wall = time.perf_counter() - t_all
    env.close()
    return {
        "steps": len(latencies),
        "steps_per_s": len(latencies) / sum(latencies),
        "episodes_per_s": len(latencies) / wall,
        "p50_s": _pct(latencies, 0.5),
        "p99_s": _pct(latencies, 0.99),
    }


def _markdown(config: ServeLoadConfig, r: dict[str, Any]) -> str:
    idle, step, local = r["idle"], r["stepping"], r["in_process"]
    ms = lambda s: f"{1000 * s:.1f} ms"
    lines = [
        f"Stack `{config.stack}`, tier `{config.tier}`, task `{config.task}`, one-turn episodes; "
        f"world-model server step p50 (inside the stack): {ms(r['server_step_p50_s'])}; predictions "
        + (
            f"batched ({step['predict_calls']} predict calls, {step['mean_batch']:.1f} requests each on average, "
            f"largest {step['largest_batch']})."
            if config.batch_predictions and step.get("mean_batch")
            else "one at a time."
        ),
        "",
        "| measure | wmrl-serve (loopback, WebSocket) | in-process stack |",
        "|---|---|---|",
        f"| sessions held at once (idle) | {idle['held']} of {idle['sessions']} "
        f"(opened in {idle['open_s']:.1f} s, server RSS {idle['server_rss_mb']:.0f} MB) | - |",
        f"| sessions stepping at once | {step['sessions']} ({step['steps']} steps, "
        f"{step['wm_graded']} graded by the world model, {len(step['errors'])} errors) | 1 |",
        f"| steps/s (each after its reset, both counted in the time) | {step['steps_per_s']:.1f} "
        f"| {local['episodes_per_s']:.1f} |",
        f"| step latency p50 | {ms(step['p50_s'])} | {ms(local['p50_s'])} |",
        f"| step latency p99 | {ms(step['p99_s'])} | {ms(local['p99_s'])} |",
    ]
    return "\n".join(lines)


def run(config: ServeLoadConfig, run_dir: Path, *, progress: bool = True) -> dict[str, Any]:
    from wmrl_envs.autoresearch.leaderboard import reference_pool

    script = next(s.code for s in reference_pool(config.task, size=config.tier) if s.solution_id == "majority")
    action = f"```python\n{script}\n```"
    server = _Server(config)
    try:
        _warm_up(server, config, action)
        idle = _idle(server, config)
        time.sleep(1.0)  # the server closes the idle sessions
        before = server.metrics()["counters"]
        stepping = _stepping(server, config, action)
        after = server.metrics()
        server_p50 = after["step_latency_s"]["p50"]
        calls = after["counters"]["wm_calls"] - before["wm_calls"]
        predictions = after["counters"]["wm_predictions"] - before["wm_predictions"]
        stepping["predict_calls"] = calls  # world-model predict calls of the stepping phase
        stepping["mean_batch"] = predictions / calls if calls else None
        stepping["largest_batch"] = after.get("largest_prediction_batch")
    finally:
        server.stop()
    result: dict[str, Any] = {
        "idle": idle,
        "stepping": stepping,
        "server_step_p50_s": server_p50,
        "in_process": _in_process(config, action),
    }
    result["markdown"] = _markdown(config, result)
    write_json(run_dir / "results.json", {k: v for k, v in result.items() if k != "markdown"})
    (run_dir / "results.md").write_text(result["markdown"] + "\n")
    return result
