"""``wmrl-serve`` (issue 28): a real server process on loopback, driven over HTTP and WebSocket.

* one GRPO anchor group whose two members live in two sessions (one HTTP, one WebSocket)
  reaches the server's one calibrator: its pairs and its group result;
* a server killed (SIGKILL) mid-anchor restarts from its checkpoint with every pair it had;
* bad input and faults: malformed JSON, unknown sessions and fields, oversized actions and
  bodies, a WebSocket client gone mid-episode: clear 4xx JSON errors, the server lives on;
* ``wmrl/Remote-v0`` passes ``check_env`` against a server.

Real components only: the server is the ``wmrl-serve`` CLI in a subprocess, real executions run
in the sandbox, the world model is the shipped ``CodeOutcomeModel``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import requests

pytest.importorskip("openenv")
websockets_sync = pytest.importorskip("websockets.sync.client")

from serve_helpers import ROOT, Server, servers  # noqa: E402,F401

from wmrl_envs.autoresearch.leaderboard import reference_pool  # noqa: E402

TASK = "titanic"


def fence(code: str) -> str:
    return f"```python\n{code}\n```"


@pytest.fixture(scope="module")
def script() -> str:
    return fence(next(s.code for s in reference_pool(TASK, size="small") if s.solution_id == "majority"))


def ws_call(ws, kind: str, data: dict | None = None) -> dict:
    ws.send(json.dumps({"type": kind, "data": data or {}}))
    return json.loads(ws.recv(timeout=120))


def test_an_anchor_group_across_http_and_websocket_reaches_the_calibrator(servers, script, tmp_path):
    state = tmp_path / "state.json"
    server = Server("--stack", "wmrl", "--anchor-fraction", "1.0", "--checkpoint", str(state))
    servers.append(server)
    assert server.get("/health")["stack"] == "wmrl"
    assert server.get("/spaces")["action"]["type"] == "text"
    assert server.get("/metrics")["anchor_pairs_total"] == 0

    # member 1 over HTTP, member 2 over a WebSocket: one group of 2 spanning two sessions
    opened = server.post("/reset", group_id="g0", group_size=2, task=TASK)
    assert opened.status_code == 200, opened.text
    http_obs = opened.json()["observation"]
    assert http_obs["info"]["anchor"] is True and http_obs["info"]["task_id"] == TASK
    with websockets_sync.connect(server.ws_url, max_size=None) as ws:
        reset = ws_call(ws, "reset", {"group_id": "g0", "group_size": 2, "task": TASK})
        assert reset["type"] == "observation", reset
        assert reset["data"]["observation"]["info"]["group_id"] == "g0"
        assert reset["data"]["observation"]["info"]["anchor"] is True

        stepped = server.post("/step", session_id=opened.json()["session_id"], action={"text": script}).json()
        info = stepped["observation"]["info"]
        assert stepped["done"] and info["source"] == "env"  # anchor member: graded for real, too
        assert 0.0 <= info["wm_score"] <= 1.0 and info["true_score"] == info["outcome"]["score"]
        assert len(info["anchor_pairs"]) == 1 and info["anchor_pairs_total"] == 1

        ws_step = ws_call(ws, "step", {"text": script})
        assert ws_step["type"] == "observation", ws_step
        ws_info = ws_step["data"]["observation"]["info"]
        assert ws_step["data"]["done"] and len(ws_info["anchor_pairs"]) == 1
        assert ws_info["anchor_pairs_total"] == 2  # the second session saw the first one's pair

    metrics = server.get("/metrics")
    assert metrics["anchor_pairs_total"] == 2 and metrics["anchor_share"] == 1.0
    assert metrics["monitor"]["anchor_groups"] == 1  # the group result reached the monitor
    assert metrics["counters"]["real_executions"] == 2 and metrics["counters"]["wm_predictions"] == 2
    assert metrics["open_groups"] == 0 and metrics["map"]["fitted"] is False
    saved = json.loads(state.read_text())  # checkpointed as the pairs arrived
    assert saved["calibration"]["debiaser"]["n_seen"] == 2
    server.stop()
    assert server.proc.poll() is not None


def test_a_server_killed_mid_anchor_restarts_with_every_pair(servers, script, tmp_path):
    state = tmp_path / "state.json"
    args = ("--stack", "wmrl", "--anchor-fraction", "1.0", "--checkpoint", str(state))
    first = Server(*args)
    servers.append(first)
    a = first.post("/reset", group_id="g1", group_size=3, task=TASK).json()
    b = first.post("/reset", group_id="g1", group_size=3, task=TASK).json()
    first.post("/step", session_id=a["session_id"], action={"text": script})
    assert first.get("/metrics")["anchor_pairs_total"] == 1
    # member b is mid-episode, the third member has not joined: the anchor group is open
    first.stop(signal.SIGKILL)

    second = Server(*args)
    servers.append(second)
    metrics = second.get("/metrics")
    assert metrics["restored_pairs"] == 1 and metrics["anchor_pairs_total"] == 1
    # the group's dead member (b) counts as finished-unknown; the third member still joins it
    c = second.post("/reset", group_id="g1", group_size=3, task=TASK)
    assert c.status_code == 200 and c.json()["observation"]["info"]["anchor"] is True
    done = second.post("/step", session_id=c.json()["session_id"], action={"text": script}).json()
    assert done["observation"]["info"]["anchor_pairs_total"] == 2
    metrics = second.get("/metrics")
    assert metrics["open_groups"] == 0 and metrics["monitor"]["anchor_groups"] == 1
    # the old session is gone with the old process
    gone = second.post("/step", session_id=b["session_id"], action={"text": script})
    assert gone.status_code == 404 and gone.json()["error"] == "unknown_session"
    second.stop()


def test_bad_input_and_faults_get_clear_4xx_json(servers):
    server = Server("--stack", "wm", "--max-body-bytes", "100000")
    servers.append(server)
    s = requests.Session()

    bad_json = s.post(server.url + "/step", data="{not json", headers={"content-type": "application/json"})
    assert bad_json.status_code == 422 and bad_json.json()["error"] == "invalid_request"
    missing = server.post("/step", action={"text": "x"})
    assert missing.status_code == 422 and "session_id" in json.dumps(missing.json()["detail"])
    unknown = server.post("/step", session_id="no-such-session", action={"text": "x"})
    assert unknown.status_code == 404 and unknown.json()["error"] == "unknown_session"
    assert requests.get(server.url + "/state?session_id=nope").status_code == 404
    field = server.post("/reset", group_id="g", colour="blue")
    assert field.status_code == 422 and "colour" in json.dumps(field.json()["detail"])
    opened = server.post("/reset", options={"no_such_option": 1})
    assert opened.status_code == 422 and "no_such_option" in opened.json()["detail"]

    sid = server.post("/reset", group_id="g2", group_size=1).json()["session_id"]
    wrong_type = server.post("/step", session_id=sid, action={"values": [1.0]})
    assert wrong_type.status_code == 422 and wrong_type.json()["error"] == "invalid_action"
    huge = server.post("/step", session_id=sid, action={"text": "x" * 40_000})
    assert huge.status_code == 413 and "max_action_chars=32768" in huge.json()["detail"]
    body = server.post("/step", session_id=sid, action={"text": "x" * 200_000})
    assert body.status_code == 413 and "max_body_bytes=100000" in body.json()["detail"]
    ok = server.post("/step", session_id=sid, action={"text": "no code here"})
    assert ok.status_code == 200 and ok.json()["done"]
    again = server.post("/step", session_id=sid, action={"text": "no code here"})
    assert again.status_code == 409 and again.json()["error"] == "episode_state"
    assert server.post("/begin_step", group_ids="g").status_code == 422

    # WebSocket: bad messages get error frames and the session lives on; a client that
    # vanishes mid-episode frees its session
    with websockets_sync.connect(server.ws_url) as ws:
        ws.send("{oops")
        assert json.loads(ws.recv(timeout=30))["data"]["code"] == "INVALID_JSON"
        assert ws_call(ws, "jump")["data"]["code"] == "UNKNOWN_TYPE"
        assert ws_call(ws, "reset", {"group_id": "g3", "group_size": 2})["type"] == "observation"
        too_big = ws_call(ws, "step", {"text": "y" * 40_000})
        assert too_big["type"] == "error" and "max_action_chars=32768" in too_big["data"]["message"]
        assert server.get("/metrics")["sessions"] == 2  # the HTTP one and this one
    time.sleep(0.5)  # the server notices the closed socket
    assert server.get("/metrics")["sessions"] == 1
    assert requests.delete(f"{server.url}/sessions/{sid}").json()["closed"] is True
    assert server.get("/metrics")["sessions"] == 0
    assert server.get("/health")["status"] == "healthy"
    server.stop()


def test_wmrl_serve_help():
    out = subprocess.run(
        [sys.executable, "-m", "wrappers.serving.cli", "--help"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    for flag in ("--env", "--split", "--tier", "--stack", "--port", "--checkpoint", "--max-action-chars"):
        assert flag in out


@pytest.mark.skipif(not os.environ.get("PATH"), reason="needs a shell PATH")
def test_remote_env_passes_check_env(servers):
    import gymnasium as gym
    from gymnasium.utils.env_checker import check_env

    import wmrl_envs  # noqa: F401

    server = Server("--stack", "wm")
    servers.append(server)
    env = gym.make("wmrl/Remote-v0", url=server.url)
    check_env(env.unwrapped, skip_render_check=True)
    obs, info = env.reset(seed=0, options={"group_id": "r0", "group_size": 1})
    assert isinstance(obs, str) and info["group_id"] == "r0"
    obs, reward, terminated, truncated, info = env.step("no code")
    assert terminated and info["outcome"].status == "malformed" and reward == 0.0
    env.close()
    assert server.get("/metrics")["sessions"] == 0
    server.stop()


def test_serve_load_benchmark_minimal_run(tmp_path, capsys):
    from benchmarks.__main__ import main

    args = ["--idle-sessions", "6", "--stepping-sessions", "3", "--episodes", "2", "--in-process-episodes", "4"]
    assert main(["serve-load", "--run-dir", str(tmp_path), *args]) == 0
    result = json.loads((tmp_path / "results.json").read_text())
    assert result["idle"]["held"] == 6
    assert result["stepping"]["steps"] == 6 and result["stepping"]["wm_graded"] == 6
    assert not result["stepping"]["errors"] and result["in_process"]["steps"] == 4
    assert "| steps/s" in (tmp_path / "results.md").read_text() and "sessions held" in capsys.readouterr().out


@pytest.mark.libero
def test_the_libero_env_is_served_with_its_progress_world_model():
    pytest.importorskip("libero.libero")
    from fastapi.testclient import TestClient

    from wrappers.serving.app import ServerConfig, create_app

    env_kwargs = {"task_id": 0, "cameras": False, "max_episode_steps": 3}
    config = ServerConfig(env_id="wmrl/LIBERO-Long-v0", env_kwargs=env_kwargs, stack="wmrl", anchor_fraction=1.0)
    with TestClient(create_app(config)) as client:
        spaces = client.get("/spaces").json()
        assert spaces["action"]["type"] == "box" and spaces["action"]["shape"] == [7]
        opened = client.post("/reset", json={"group_id": "g", "group_size": 1, "seed": 0}).json()
        assert {"instruction", "proprio"} <= set(opened["observation"]["observation"])
        for _ in range(3):
            step = client.post("/step", json={"session_id": opened["session_id"], "action": {"values": [0.0] * 7}})
        info = step.json()["observation"]["info"]
        assert step.json()["done"] and info["source"] == "env" and "wm_score" in info  # an anchor episode
        assert client.get("/metrics").json()["anchor_pairs_total"] == 1
        outside = client.post("/step", json={"session_id": opened["session_id"], "action": {"values": [5.0] * 7}})
        assert outside.status_code == 422 and "outside the action space" in outside.json()["detail"]


def test_sb3_and_the_stack_handle_run_unchanged_on_the_remote_env(servers):
    import gymnasium as gym
    from stable_baselines3 import PPO

    import wmrl_envs  # noqa: F401
    from agents.sb3 import PlanChoiceWrapper
    from wrappers import StackHandle

    server = Server("--stack", "wmrl", "--anchor-fraction", "0.5")
    servers.append(server)
    remote = gym.make("wmrl/Remote-v0", url=server.url)
    handle = StackHandle(remote)  # what agents.grpo talks to
    assert handle.has_anchors and handle.anchor_weight == 1.0 and handle.real_executions == 0
    assert len(handle.begin_step(["a", "b"])) == 1  # decided by the server's scheduler (floor 1)
    env = PlanChoiceWrapper(remote)
    model = PPO("MlpPolicy", env, n_steps=16, batch_size=8, n_epochs=1, seed=0, device="cpu").learn(total_timesteps=16)
    assert model.num_timesteps == 16
    metrics = server.get("/metrics")
    assert metrics["counters"]["wm_predictions"] == 16 and metrics["anchor_share"] is not None
    assert handle.real_executions == metrics["counters"]["real_executions"]
    env.close()
    server.stop()


# ------------------------------------------------------------------ batched world-model predictions
SOLUTIONS = ("majority", "prior", "logreg_C1.0", "tree_depth_2", "rf_100", "broken_no_submission")


def _cases(tasks=("titanic", "penguins"), solutions=SOLUTIONS) -> list[tuple[str, str]]:
    pools = {t: {s.solution_id: s.code for s in reference_pool(t, size="small")} for t in tasks}
    return [(t, fence(pools[t][sid])) for t in tasks for sid in solutions]


def _sessions(shared, cases, groups) -> list:
    import gymnasium as gym

    import wmrl_envs  # noqa: F401

    sessions = [shared.attach(gym.make("wmrl/AutoResearch-v0", tier="small", max_turns=1)) for _ in cases]
    for session, (task, _), (group, size) in zip(sessions, cases, groups):
        _, info = session.reset(options={"group_id": group, "group_size": size, "task": task})
        session.anchor = info.get("anchor", False)  # the wm stack has no anchors
    return sessions


def _step_together(shared, sessions, cases) -> list[dict]:
    """Every session steps in its own thread; the grader is held busy until all their requests
    wait, so they meet in one batch (deterministically, not by timing luck)."""
    import threading

    grader = shared._grader
    infos: list = [None] * len(sessions)

    def step(k: int) -> None:
        infos[k] = sessions[k].step(cases[k][1])[4]

    with grader._cv:
        grader._running = True  # as if a prediction were running: arrivals queue
    threads = [threading.Thread(target=step, args=(k,)) for k in range(len(sessions))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while len(grader._queue) < len(sessions) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(grader._queue) == len(sessions)
    with grader._cv:
        grader._running = False
        grader._cv.notify_all()
    for t in threads:
        t.join(timeout=120)
    return infos


def test_concurrent_sessions_are_predicted_in_one_batch_with_the_scores_of_one_at_a_time():
    from wmrl_envs.world_models import CodeOutcomeModel
    from wrappers.serving.shared import SharedStack

    wm = CodeOutcomeModel.load_default()
    cases = _cases()
    groups = [(f"g{k}", 1) for k in range(len(cases))]

    one_by_one = SharedStack("wm", wm, batch_predictions=False)
    sessions = _sessions(one_by_one, cases, groups)
    expected = [s.step(action)[4] for s, (_, action) in zip(sessions, cases)]
    assert one_by_one._grader.counters.wm_calls == len(cases)
    for session in sessions:
        one_by_one.detach(session)

    batched = SharedStack("wm", wm)
    sessions = _sessions(batched, cases, groups)
    got = _step_together(batched, sessions, cases)
    for session in sessions:
        batched.detach(session)
    counters = batched._grader.counters
    assert counters.wm_calls == 1 and counters.wm_predictions == len(cases)  # one predict call
    assert batched.metrics()["largest_prediction_batch"] == len(cases)
    for g, e in zip(got, expected):
        assert g["source"] == e["source"] == "wm"
        assert g["wm_score"] == e["wm_score"] and g["calibrated_score"] == e["calibrated_score"]
        assert g["outcome"].status == e["outcome"].status and g["outcome"].score == e["outcome"].score
    assert sum(g["wm_seconds"] for g in got) == pytest.approx(counters.wm_seconds)

    # wmrl: the anchor group's members are in the batch and still graded for real; its pairs
    # reach the calibrator; the other group's rewards are the world model's
    cheap = _cases(solutions=("majority", "prior"))
    wmrl = SharedStack("wmrl", wm, anchor_fraction=0.5)
    assert len(wmrl.begin_step(["a", "b"])) == 1
    sessions = _sessions(wmrl, cheap, [("a", 2), ("a", 2), ("b", 2), ("b", 2)])
    got = _step_together(wmrl, sessions, cheap)
    assert wmrl._grader.counters.wm_calls == 1 and wmrl._grader.counters.wm_predictions == 4
    reference = {(t, a): e for (t, a), e in zip(cases, expected)}
    for session, case, info in zip(sessions, cheap, got):
        assert info["wm_score"] == reference[case]["wm_score"]
        if session.anchor:
            assert info["source"] == "env" and info["true_score"] is not None
        else:
            assert info["source"] == "wm" and "true_score" not in info
    assert sum(s.anchor for s in sessions) == 2
    metrics = wmrl.metrics()
    assert metrics["anchor_pairs_total"] == 2 and wmrl._grader.counters.real_executions == 2
    for session in sessions:
        wmrl.detach(session)
