"""Supervised warm start of an LLM policy on demonstration replies (before GRPO).

A long warm start (SmolLM2 on the agent corpus's scripts: ~10 CPU-s per script on CPU) can
keep a checkpoint: every ``checkpoint_every`` steps the trainable weights, the optimiser, the
losses so far and the draw state go to one file (written atomically), and a call with the
same file continues from it, so a killed run loses at most ``checkpoint_every`` steps.

Functions: :func:`warm_start`.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm

from agents.llm.policy import LLMPolicy
from agents.llm.scaffolds import Scaffold, TaskSpec

__all__ = ["warm_start"]


def warm_start(
    policy: LLMPolicy,
    scaffold: Scaffold,
    specs: Sequence[TaskSpec],
    replies: Sequence[str | tuple[str, str]],
    *,
    steps: int = 30,
    learning_rate: float = 3e-3,
    seed: int = 0,
    observations: Mapping[str, str] | None = None,
    batch_size: int | None = None,
    micro_batch_size: int | None = None,
    checkpoint: str | Path | None = None,
    checkpoint_every: int = 10,
    progress: bool = False,
) -> list[float]:
    """Supervised warm start: maximise the likelihood of demonstration ``replies`` (the text
    the model should write after the scaffold's response prefix) on the scaffold's prompts.

    Args:
        policy / scaffold: what is trained, and how its prompts are built.
        specs: the tasks whose prompts the replies are paired with.
        replies: a plain reply is paired with a random task of ``specs`` each time (plans fit
            any task); a ``(task_id, reply)`` pair always with its own task's prompt (a script
            names its table's columns).
        steps: optimiser steps.
        learning_rate: AdamW step size.
        seed: the pairing and minibatch draws.
        observations: the first observation per task id, as the env's ``reset`` gives it
            (default: empty; the plan scaffolds build their prompt from the task spec alone,
            the raw-code scaffold shows the observation).
        batch_size: replies per step, drawn without replacement and reshuffled once all were
            used (``None``: every reply in every step).
        micro_batch_size: sequences per forward/backward pass, gradients accumulated over the
            batch (``None``: the whole batch in one pass). Long sequences of unequal length
            want 1: padding takes attention off its memory-efficient path, so SmolLM2 on two
            scripts of ~1,300 tokens peaked at 14 GB and 48 CPU-s, one at a time at 3 GB and
            8 CPU-s each.
        checkpoint: a file to continue from (when it exists) and to save to every
            ``checkpoint_every`` steps and at the end (module docstring). A finished
            checkpoint loads its weights and returns its losses without training again.
        progress: show a progress bar with the latest loss.

    Meant for models that cannot yet follow the format (from-config models on plans,
    SmolLM2 on whole scripts); returns the loss per step.
    """
    if not specs or not replies:
        raise ValueError("warm_start needs at least one task spec and one reply")
    for name, value in (("batch_size", batch_size), ("micro_batch_size", micro_batch_size)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1 or None, got {value!r}")
    by_id = {s.task_id: s for s in specs}
    unknown = sorted({r[0] for r in replies if not isinstance(r, str) and r[0] not in by_id})
    if unknown:
        raise ValueError(f"replies name tasks that are not among the specs: {unknown}")
    rng = random.Random(seed)
    prefix = (
        policy.tokenizer(scaffold.response_prefix, add_special_tokens=False)["input_ids"]
        if scaffold.response_prefix
        else []
    )
    obs = observations or {}
    prompts = {
        s.task_id: policy.chat_ids(scaffold.initial_messages(obs.get(s.task_id, ""), s)) + list(prefix) for s in specs
    }
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=learning_rate)
    losses: list[float] = []
    order: list[int] = []
    file = Path(checkpoint) if checkpoint is not None else None
    if file is not None and file.is_file():
        saved = torch.load(file, weights_only=False)  # our own file: weights plus the draw state
        if saved["replies"] != len(replies) or saved["batch_size"] != batch_size:
            raise ValueError(
                f"{file} is a warm start of {saved['replies']} replies in batches of {saved['batch_size']}, "
                f"not {len(replies)} in batches of {batch_size}: remove it or pass another checkpoint"
            )
        policy.load_trainable_state_dict(saved["policy"])
        optimizer.load_state_dict(saved["optimizer"])
        losses, order = list(saved["losses"]), list(saved["order"])
        rng.setstate(saved["rng"])

    def save() -> None:
        assert file is not None
        file.parent.mkdir(parents=True, exist_ok=True)
        state = {
            "policy": policy.trainable_state_dict(), "optimizer": optimizer.state_dict(), "losses": losses,
            "order": order, "rng": rng.getstate(), "replies": len(replies), "batch_size": batch_size,
        }  # fmt: skip
        torch.save(state, file.with_suffix(".tmp"))
        os.replace(file.with_suffix(".tmp"), file)  # never a half-written checkpoint

    policy.model.train()
    bar = tqdm(total=steps, initial=len(losses), desc="warm start", disable=not progress)
    for _ in range(len(losses), steps):
        if batch_size is None:
            batch = list(range(len(replies)))
        else:
            while len(order) < batch_size:  # an epoch at a time, so every reply is seen as often
                epoch = list(range(len(replies)))
                rng.shuffle(epoch)
                order += epoch
            batch, order = order[:batch_size], order[batch_size:]
        seqs, masks = [], []
        for i in batch:
            reply = replies[i]
            task_id, text = (rng.choice(specs).task_id, reply) if isinstance(reply, str) else reply
            ctx = prompts[task_id]
            target = policy.tokenizer(text, add_special_tokens=False)["input_ids"] + [policy.eos_token_id]
            seqs.append(ctx + target)
            masks.append([0] * len(ctx) + [1] * len(target))
        optimizer.zero_grad(set_to_none=True)
        chunk = micro_batch_size or len(seqs)
        tokens = sum(sum(m) for m in masks)  # the batch's mean token loss, accumulated chunk by chunk
        loss_sum = 0.0
        for j in range(0, len(seqs), chunk):
            lp, _, mask = policy.token_logprobs(seqs[j : j + chunk], masks[j : j + chunk])
            loss = -(lp * mask).sum() / tokens
            loss.backward()
            loss_sum += float(loss.detach())
        optimizer.step()
        losses.append(loss_sum)
        bar.update()
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
        if file is not None and len(losses) % checkpoint_every == 0:
            save()
    bar.close()
    if file is not None and (len(losses) % checkpoint_every or not file.is_file()):
        save()
    policy.sync_backend()
    return losses
