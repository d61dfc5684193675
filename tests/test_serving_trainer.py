"""The project's own GRPO trainer against a ``wmrl-serve`` server (issue 28: ``wmrl/Remote-v0``
"runs our own trainer and SB3 unchanged against a server"; SB3: tests/test_serving.py).

``python -m agents.llm train --remote URL`` rolls the tiny policy out through one server session
per slot (:class:`~wmrl_envs.remote.RemoteVectorEnv`): no stack is built in the trainer's
process, the server's world model grades, its scheduler picks the anchor groups, its calibrator
receives their pairs, and the run's rewards equal those of the same run on the in-process stack.

Real components only: the server is the ``wmrl-serve`` CLI in a subprocess (``wmrl`` stack, small
tier, local sandbox, the shipped world model), the policy the warm-started tiny model.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("openenv")
pytest.importorskip("websockets.sync.client")
pytest.importorskip("transformers")

from serve_helpers import Server, servers  # noqa: E402,F401

#: Two steps of two groups of two on two tasks: one anchor group per step (the scheduler's
#: floor), one graded by the world model.
TRAIN = ["--policy", "tiny-plan", "--total-steps", "2", "--groups-per-step", "2", "--group-size", "2"]
TRAIN += ["--tasks", "titanic", "penguins", "--tensorboard", "false", "--progress", "false"]
KEYS = ("reward/mean", "reward/env", "reward/wm", "reward/valid_rate", "anchor/groups", "real_executions/step")


def _history(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_the_grpo_trainer_trains_against_a_wmrl_server(servers, tmp_path, capsys):
    from agents.grpo.diagnostics import CorrectionsIdleWarning
    from agents.llm.__main__ import main

    server = Server("--stack", "wmrl", "--tier", "small")
    servers.append(server)

    # usage errors first, in one line each: the stack is the server's
    assert main(["train", "--remote", server.url, "--stack", "wm", "--output-dir", str(tmp_path / "x"), *TRAIN]) == 2
    assert "serves the 'wmrl' stack, not --stack 'wm'" in capsys.readouterr().err
    bad = ["train", "--remote", server.url, "--anchor-fraction", "0.5", "--output-dir", str(tmp_path / "x"), *TRAIN]
    assert main(bad) == 2
    assert "--anchor-fraction: with --remote the stack is the server's" in capsys.readouterr().err

    remote_out = tmp_path / "remote"
    # the server's calibrator cannot fit in 2 steps: said as for an in-process stack
    with pytest.warns(CorrectionsIdleWarning, match="needs 200 anchor pairs"):
        assert main(["train", "--remote", server.url, "--output-dir", str(remote_out), *TRAIN]) == 0
    printed = capsys.readouterr().out
    assert f"training against {server.url} (wmrl stack on the server, 4 sessions)" in printed
    remote = _history(remote_out)
    assert [h["step"] for h in remote] == [1, 2]
    assert all(h["anchor/groups"] == 1 for h in remote)
    # rewards graded by the server's world model (episodes whose info["source"] was "wm") ...
    assert any(h["reward/wm"] is not None for h in remote)
    # ... and by real execution in its anchor groups, whose pairs reached its calibrator
    metrics = server.get("/metrics")
    assert metrics["anchor_pairs_total"] >= 1 and metrics["counters"]["wm_predictions"] >= 1
    assert metrics["counters"]["real_executions"] == sum(h["real_executions/step"] for h in remote)
    # every server episode was one the trainer asked for: 4 groups, 2 anchors, none left open
    # (an autoreset episode would join an automatic group and lower the anchor share)
    assert metrics["anchor_share"] == 0.5 and metrics["open_groups"] == 0 and metrics["sessions"] == 0
    saved = json.loads((remote_out / "checkpoint" / "trainer.json").read_text())
    assert saved["setup"]["remote"] == server.url and saved["setup"]["stack"] == "wmrl"
    assert not (remote_out / "checkpoint" / "wrappers.json").exists()  # the server keeps the stack's state

    # the same run on the in-process stack: the same rewards, step by step
    local_out = tmp_path / "local"
    with pytest.warns(CorrectionsIdleWarning):
        assert main(["train", "--stack", "wmrl", "--output-dir", str(local_out), *TRAIN]) == 0
    local = _history(local_out)
    assert [{k: h[k] for k in KEYS} for h in remote] == [{k: h[k] for k in KEYS} for h in local]
    server.stop()


def test_remote_without_a_server_is_a_usage_error(tmp_path, capsys):
    from agents.llm.__main__ import main

    args = ["train", "--remote", "http://127.0.0.1:9", "--output-dir", str(tmp_path), *TRAIN]
    assert main(args) == 2
    assert "--remote 'http://127.0.0.1:9': no wmrl-serve server at http://127.0.0.1:9" in capsys.readouterr().err
