"""Supervised warm start of an LLM policy on demonstration replies (before GRPO).

Functions: :func:`warm_start`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

from agents.llm.policy import LLMPolicy
from agents.llm.scaffolds import Scaffold, TaskSpec

__all__ = ["warm_start"]


def warm_start(
    policy: LLMPolicy,
    scaffold: Scaffold,
    specs: Sequence[TaskSpec],
    replies: Sequence[str],
    *,
    steps: int = 30,
    learning_rate: float = 3e-3,
    seed: int = 0,
) -> list[float]:
    """Supervised warm start: maximise the likelihood of demonstration ``replies`` (the text
    the model should write after the scaffold's response prefix) on the scaffold's prompts
    for ``specs``; one full batch of ``len(replies)`` (reply, random spec) pairs per step.

    Meant for small from-config models that cannot yet follow the format at all; returns
    the loss per step.
    """
    if not specs or not replies:
        raise ValueError("warm_start needs at least one task spec and one reply")
    rng = random.Random(seed)
    prefix = (
        policy.tokenizer(scaffold.response_prefix, add_special_tokens=False)["input_ids"]
        if scaffold.response_prefix
        else []
    )
    prompts = {s.task_id: policy.chat_ids(scaffold.initial_messages("", s)) + list(prefix) for s in specs}
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=learning_rate)
    losses = []
    policy.model.train()
    for _ in range(steps):
        seqs, masks = [], []
        for reply in replies:
            ctx = prompts[rng.choice(specs).task_id]
            target = policy.tokenizer(reply, add_special_tokens=False)["input_ids"] + [policy.eos_token_id]
            seqs.append(ctx + target)
            masks.append([0] * len(ctx) + [1] * len(target))
        lp, _, mask = policy.token_logprobs(seqs, masks)
        loss = -(lp * mask).sum() / mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    policy.sync_backend()
    return losses
