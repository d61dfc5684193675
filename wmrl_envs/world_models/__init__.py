"""World models: learned (or instrumented) simulators of outcomes.

Every world model implements :class:`WorldModel` — ``predict(contexts, actions) ->
list[Outcome | None]``, batched, ``source="wm"``, ``None`` when it cannot say.

* :class:`CodeOutcomeModel` — gradient-boosted trees on parsed-script features, trained on
  execution logs; fast on CPU; exact compile gate; ``load_default()`` ships fitted.
* :class:`LMWorldModel` — the paper's world model: a causal LM reads task + line-numbered
  solution and answers JSON (status, quality bucket, feedback).
* :class:`NoisyOracle` — research instrument: true outcome + chosen bias + noise.
* :func:`evaluate_fidelity` / :class:`FidelityReport` — how faithful a world model is on
  held-out logs (status accuracy, Spearman, centred bias before/after calibration).

Importing this package does not import torch/transformers (``lm`` loads them lazily).
"""

from wmrl_envs.world_models.base import WorldModel, check_batch, predict_requests
from wmrl_envs.world_models.code_outcome import CodeOutcomeConfig, CodeOutcomeModel
from wmrl_envs.world_models.features import ScriptFeaturizer, summarize_script
from wmrl_envs.world_models.fidelity import (
    FidelityReport,
    centred_bias,
    evaluate_fidelity,
    fidelity_from_scores,
    markdown_table,
)
from wmrl_envs.world_models.lm import (
    QUALITY_BUCKETS,
    LMWorldModel,
    LMWorldModelConfig,
    parse_last_json,
    parse_prediction,
)
from wmrl_envs.world_models.logs import LogRecord, read_logs, split_by_task, write_logs
from wmrl_envs.world_models.noisy_oracle import BIAS_PRESETS, LoggedOutcomes, NoisyOracle, quadratic_bias

__all__ = [
    "WorldModel", "check_batch", "predict_requests",
    "CodeOutcomeConfig", "CodeOutcomeModel", "ScriptFeaturizer", "summarize_script",
    "FidelityReport", "evaluate_fidelity", "fidelity_from_scores", "centred_bias", "markdown_table",
    "LMWorldModel", "LMWorldModelConfig", "QUALITY_BUCKETS", "parse_last_json", "parse_prediction",
    "LogRecord", "read_logs", "write_logs", "split_by_task",
    "NoisyOracle", "LoggedOutcomes", "BIAS_PRESETS", "quadratic_bias",
]  # fmt: skip
