"""LoRA by default for SmolLM2 training: the rule, the loader, and what the CLI records."""

from __future__ import annotations

import pytest

from agents.llm.__main__ import AgentSetup
from agents.llm.loading import load_policy, lora_by_default


def _adapter_only(policy) -> bool:
    names = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    return bool(names) and all("lora_" in n for n in names)


def test_rule_and_cli_default():
    assert lora_by_default("default") is True
    assert not any(lora_by_default(p) for p in ("tiny", "tiny-plan", "HuggingFaceTB/SmolLM2-360M-Instruct"))
    assert AgentSetup().lora is None  # resolved per policy by train/evaluate, then recorded


def test_tiny_policy_keeps_full_fine_tuning_unless_asked():
    assert not _adapter_only(load_policy("tiny", lora=None))
    assert _adapter_only(load_policy("tiny", lora=True))


@pytest.mark.llm
def test_smollm2_trains_an_adapter_by_default():
    policy = load_policy("default", lora=None)
    assert _adapter_only(policy)
    trainable = sum(p.numel() for p in policy.trainable_parameters())
    total = sum(p.numel() for p in policy.model.parameters())
    assert trainable < 0.1 * total
