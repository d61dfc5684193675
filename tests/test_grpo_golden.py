"""A seeded LLM run and a seeded VLA run give the same metrics as before the GRPO loop was
shared by both agents (issue 26: "no behaviour change").

The golden metrics in ``tests/data/golden_*.json`` were recorded by this file's runs on the
code *before* the refactor (``WMRL_WRITE_GOLDEN=1 pytest tests/test_grpo_golden.py``
rewrites them; never do that to make a refactor pass). Compared: every metric but
timings and memory, to 1e-6 relative; metrics added since may appear, none may go missing.
The LLM run grades with the world model that was the shipped default when the metrics were
recorded (``tests/data/golden_world_model``, commit 10c4243), so refitting the default does
not move them.

Float results differ between CPUs (the BLAS kernels a CPU gets), and in a GRPO step the
gradient is a difference of near-equal terms, so a 1e-7 difference becomes a 0.5% one in the
gradient norm and, one update later, another sampled token. So each run has one recording per
kind of machine seen, every one made by the *pre-refactor* code (d04ab2f, in a separate
worktree, one intra-op thread): ``golden_<name>.json`` (the first machine) and
``golden_<name>.<machine>.json`` (``amd-epyc-avx2``: an AMD EPYC with AVX2 and no AVX-512,
2026-12-07; there the pre-refactor code also needs Debian's python3-sklearn, its solutions'
runtime). A run passes if it matches one of them; a machine of a new kind fails until its
recording is added the same way.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

GOLDEN = Path(__file__).parent / "data"
#: Measured, not computed: they differ between any two runs.
VOLATILE = ("time/", "memory/")


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread: other tests of the same process may have changed the count, and
    float sums in another order sample other tokens."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _stable(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in h.items() if not k.startswith(VOLATILE)} for h in history]


def _mismatch(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> str | None:
    """The first difference of ``got`` from the recording ``want`` (``None``: they match)."""
    if len(got) != len(want):
        return f"{len(got)} steps, recorded {len(want)}"
    for step, (g, w) in enumerate(zip(got, want)):
        if not set(w) <= set(g):  # new metrics may be added, none may go missing
            return f"step {step}: metrics missing: {sorted(set(w) - set(g))}"
        for key in w:
            a, b = g[key], w[key]
            if isinstance(b, float) and isinstance(a, (int, float)):
                same = math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
            else:
                same = a == b
            if not same:
                return f"step {step}: {key} = {a!r}, recorded {b!r}"
    return None


def _check(name: str, history: list[dict[str, Any]]) -> None:
    got = json.loads(json.dumps(_stable(history), default=str))
    path = GOLDEN / f"golden_{name}.json"
    if os.environ.get("WMRL_WRITE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    recordings = [path, *sorted(GOLDEN.glob(f"golden_{name}.*.json"))]
    mismatches = {p.name: _mismatch(got, json.loads(p.read_text())) for p in recordings}
    assert None in mismatches.values(), f"the run matches no recording of the pre-refactor run: {mismatches}"


def test_a_run_must_match_one_recording_whole():
    recorded = [{"step": 1, "reward/mean": 0.25, "loss/grad_norm": 3.787}]
    assert _mismatch([{**recorded[0], "new/metric": 1.0}], recorded) is None  # added metrics are allowed
    assert "grad_norm" in str(_mismatch([{**recorded[0], "loss/grad_norm": 3.806}], recorded))
    assert "missing" in str(_mismatch([{"step": 1, "reward/mean": 0.25}], recorded))
    assert "steps" in str(_mismatch(recorded * 2, recorded))


def test_seeded_llm_run_matches_the_golden_metrics(tmp_path):
    import wmrl_envs  # noqa: F401  (registers the env ids)
    from agents.grpo import train
    from agents.llm.policy import LLMPolicy
    from agents.llm.scaffolds import PlanScaffold, TaskSpec
    from agents.llm.trainer import GRPOConfig, LLMAgent
    from agents.llm.warm_start import warm_start
    from wmrl_envs.autoresearch.tasks import get_task
    from wmrl_envs.vector import make_vector_env
    from wmrl_envs.world_models import CodeOutcomeModel
    from wrappers import CalibrationConfig, build_stack

    tasks = ["titanic", "penguins"]
    policy = LLMPolicy.tiny(seed=0)
    specs = [TaskSpec.from_info({**get_task(t).to_json(), **get_task(t).meta_features()}) for t in tasks]
    demos = [" random_forest\nn_estimators: 30\nmax_depth: 6", " linear\nC: 1.0\nscale: yes", " knn\nn_neighbors: 15"]
    warm_start(policy, PlanScaffold(), specs, demos, steps=40, learning_rate=1e-2)
    env = build_stack(
        make_vector_env("wmrl/AutoResearch-v0", 4, split="train", max_turns=1),
        "wmrl",
        CodeOutcomeModel.load(GOLDEN / "golden_world_model"),
        anchor_fraction=0.5,
        calibration=CalibrationConfig(start_pairs=2, refit_every=1),
    )
    config = GRPOConfig(
        groups_per_step=2,
        group_size=2,
        total_steps=3,
        max_new_tokens=24,
        learning_rate=1e-3,
        seed=3,
        output_dir=str(tmp_path / "run"),
        tensorboard=False,
        progress=False,
    )
    result = train(LLMAgent(policy, env, PlanScaffold(), config, tasks=tasks))
    env.close()
    _check("llm", result.history)


def test_seeded_vla_run_matches_the_golden_metrics(tmp_path):
    from test_vla_agent import ToyProgressWM, ToyReach, _policy, toy_statistics

    from agents.grpo import train
    from agents.vla.trainer import VLAAgent, VLAGRPOConfig
    from wrappers import CalibrationConfig, build_stack

    stats = toy_statistics()
    torch.manual_seed(0)
    env = build_stack(
        ToyReach(),
        "wmrl",
        ToyProgressWM(),
        anchor_fraction=0.5,
        calibration=CalibrationConfig(start_pairs=4, refit_every=4),
    )
    config = VLAGRPOConfig(
        total_steps=3,
        groups_per_step=2,
        group_size=3,
        init_states=(0, 1),
        rows_per_episode=3,
        micro_batch_size=8,
        action_repeat=1,
        image_size=32,
        output_dir=str(tmp_path / "vla"),
        tensorboard=False,
        progress=False,
        learning_rate=1e-3,
        seed=5,
    )
    history = train(VLAAgent(_policy(stats), env, config)).history
    _check("vla", history)
