"""Reproducible experiments on the WMRL suite: ``wmrl-bench <experiment>`` (``python -m benchmarks``).

Experiments (each a module with a config dataclass ``CONFIG`` and ``run(config, run_dir)``):

* ``speedup`` (:mod:`benchmarks.speedup`): GRPO on real execution vs GRPO on the raw world
  model vs WMRL; wall-clock / CPU by component, real executions, held-out avg@k, speedup
  and its ideal limit. The main job (README command 1) runs it on the embedded defaults.
* ``ablation`` (:mod:`benchmarks.ablation`): no correction / denoising only / debiasing
  only / both, at the same anchor ratio, on the same mixture of reward streams.
* ``fidelity`` (:mod:`benchmarks.fidelity`): world-model fidelity reports on held-out logs.
* ``agent-fidelity`` (:mod:`benchmarks.agent_fidelity`): the world model on agent-written
  scripts of unseen tables, by failure kind, and against the exploit suite.
* ``leaderboard`` (:mod:`benchmarks.leaderboard`): agents on every held-out env.
* ``scale`` (:mod:`benchmarks.scale`): sandbox runs on Ray vs a local pool, LIBERO rollouts
  on Ray actors vs ``AsyncVectorEnv``, anchors overlapped with the step vs inside it.

Shared pieces: :mod:`benchmarks.report` (run dirs, JSON, Markdown, mean/spread) and
:mod:`benchmarks.common` (task splits, shipped configs, seeds, plots). Standalone
measurement scripts live beside them (see :data:`OTHER_SCRIPTS`).
"""

__all__ = ["EXPERIMENTS", "OTHER_SCRIPTS"]

#: Experiment name -> module under ``benchmarks``.
EXPERIMENTS = {
    "speedup": "speedup",
    "ablation": "ablation",
    "fidelity": "fidelity",
    "agent-fidelity": "agent_fidelity",
    "leaderboard": "leaderboard",
    "vla": "vla_eval",
    "scale": "scale",
    "serve-load": "serve_load",
}

#: Standalone scripts (``python -m benchmarks.<name>``) owned by the modules they measure.
OTHER_SCRIPTS = {
    "sandbox_overhead": "sandbox launch overhead, local vs Docker backend",
    "wrapper_overhead": "wrapper stack overhead and world-model vs sandbox throughput",
    "agent_step_cost": "cost of one GRPO step of the LLM agent by phase",
    "llm_step_components": "SmolLM2 step components: generation tokens/s, full vs LoRA update s and peak RSS",
    "libero_throughput": "LIBERO env step throughput",
    "vla_decision_cost": "CPU per LIBERO-Long episode of a MiniVLA by action-chunk length",
    "speedup RUN_DIR": "summary of an unfinished speedup run over its finished seeds",
}
