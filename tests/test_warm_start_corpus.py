"""The raw-code warm start: the agent corpus's valid train-split scripts, each on its own task's prompt."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from agents.llm.loading import corpus_script_replies, first_observations, load_policy, warm_start_plans
from agents.llm.scaffolds import RawCodeScaffold, TaskSpec, extract_script
from agents.llm.warm_start import warm_start
from wmrl_envs.world_models.agent_corpus import HELDOUT_TABLES, read_agent_corpus


def test_corpus_replies_are_the_valid_train_split_scripts_only() -> None:
    replies = corpus_script_replies()
    valid_train = {
        (r.task_id, r.code.strip()) for r in read_agent_corpus(splits=("train",)) if r.outcome.status == "valid"
    }
    assert len(replies) == len(valid_train) > 100
    assert not {t for t, _ in replies} & set(HELDOUT_TABLES)  # never a held-out table
    for task_id, reply in replies:
        assert reply.startswith("```python\n") and reply.endswith("\n```")
        assert (task_id, extract_script(reply)) in valid_train  # the scaffold reads back the logged script


def test_first_observation_is_the_task_overview() -> None:
    obs = first_observations(["attrition", "boston"])
    assert "target column: `Attrition`" in obs["attrition"] and "`medv`" in obs["boston"].lower()


def _recording(policy):  # type: ignore[no-untyped-def]
    """Wrap ``policy.token_logprobs`` to keep every batch of sequences it is asked about."""
    seen: list[list[list[int]]] = []
    inner = policy.token_logprobs

    def token_logprobs(seqs, masks):  # type: ignore[no-untyped-def]
        seen.append([list(s) for s in seqs])
        return inner(seqs, masks)

    policy.token_logprobs = token_logprobs
    return seen


def test_a_task_paired_reply_always_gets_its_own_tasks_prompt_and_batches_cover_every_reply() -> None:
    policy = load_policy("tiny", seed=0)
    scaffold = RawCodeScaffold()
    tasks = ["attrition", "boston"]
    specs = [TaskSpec.from_task(t) for t in tasks]
    obs = first_observations(tasks)
    replies = [(t, f"```python\nprint({i})\n```") for i, t in enumerate(tasks * 2)]  # 4 replies, 2 per task
    seen = _recording(policy)
    losses = warm_start(policy, scaffold, specs, replies, steps=4, batch_size=2, observations=obs, seed=3)
    assert len(losses) == 4 and len(seen) == 4 and all(len(batch) == 2 for batch in seen)
    prompts = {s.task_id: policy.chat_ids(scaffold.initial_messages(obs[s.task_id], s)) for s in specs}
    counts: Counter[str] = Counter()
    for batch in seen:
        for seq in batch:
            # the overview in the prompt names the task's own target: a script sees its own table
            owner = [t for t, p in prompts.items() if seq[: len(p)] == p]
            assert len(owner) == 1
            reply = policy.tokenizer.decode(seq[len(prompts[owner[0]]) :], skip_special_tokens=True)
            assert (owner[0], reply) in replies
            counts[reply] += 1
    assert set(counts.values()) == {2}  # 2 epochs of 4 replies in batches of 2: each reply twice


def test_warm_start_refuses_a_reply_for_a_task_it_has_no_prompt_for() -> None:
    policy = load_policy("tiny", seed=0)
    specs = [TaskSpec.from_task("boston")]
    with pytest.raises(ValueError, match="not among the specs.*attrition"):
        warm_start(policy, RawCodeScaffold(), specs, [("attrition", "```python\npass\n```")], steps=1)
    with pytest.raises(ValueError, match="batch_size"):
        warm_start(policy, RawCodeScaffold(), specs, ["x"], steps=1, batch_size=0)


def test_raw_scaffold_warm_start_learns_the_corpus_scripts() -> None:
    policy = load_policy("tiny", seed=0)
    losses = warm_start_plans(
        policy, steps=12, learning_rate=3e-3, seed=0, scaffold=RawCodeScaffold(), batch_size=2
    )  # fmt: skip
    assert len(losses) == 12
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3  # a from-scratch model picks up Python fast


def test_a_killed_warm_start_continues_from_its_checkpoint_to_the_same_weights(tmp_path) -> None:  # type: ignore[no-untyped-def]
    specs = [TaskSpec.from_task("boston")]
    replies = [("boston", f"```python\nprint({i})\n```") for i in range(5)]
    kwargs = {"steps": 7, "batch_size": 2, "seed": 1, "learning_rate": 1e-2, "checkpoint_every": 3}
    straight = load_policy("tiny", seed=0)
    expected = warm_start(straight, RawCodeScaffold(), specs, replies, **kwargs)  # type: ignore[arg-type]

    file = tmp_path / "warm_start.pt"
    first = load_policy("tiny", seed=0)
    calls = 0
    inner = first.token_logprobs

    def dies_at_step_5(seqs, masks):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        if calls == 5:
            raise KeyboardInterrupt  # killed mid-run: steps 4-5 are lost, 1-3 were saved
        return inner(seqs, masks)

    first.token_logprobs = dies_at_step_5
    with pytest.raises(KeyboardInterrupt):
        warm_start(first, RawCodeScaffold(), specs, replies, checkpoint=file, **kwargs)  # type: ignore[arg-type]
    assert file.is_file() and not file.with_suffix(".tmp").exists()

    resumed = load_policy("tiny", seed=0)  # a fresh process: the weights come from the file
    losses = warm_start(resumed, RawCodeScaffold(), specs, replies, checkpoint=file, **kwargs)  # type: ignore[arg-type]
    assert losses == pytest.approx(expected, rel=1e-5)
    for name, tensor in straight.trainable_state_dict().items():
        assert torch.allclose(tensor, resumed.trainable_state_dict()[name], atol=1e-6), name
    # finished: the same call trains nothing more; another set of replies is refused
    again = load_policy("tiny", seed=0)
    assert warm_start(again, RawCodeScaffold(), specs, replies, checkpoint=file, **kwargs) == losses  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="remove it or pass another checkpoint"):
        warm_start(again, RawCodeScaffold(), specs, replies[:4], checkpoint=file, **kwargs)  # type: ignore[arg-type]


def test_micro_batches_accumulate_to_the_full_batch_gradient(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    grads: list[dict[str, torch.Tensor]] = []

    class Recording(torch.optim.AdamW):  # keeps the gradient of every step it takes
        def step(self, closure=None):  # type: ignore[no-untyped-def,override]
            grads.append({str(i): p.grad.detach().clone() for i, p in enumerate(self.param_groups[0]["params"])})
            return super().step(closure)

    monkeypatch.setattr(torch.optim, "AdamW", Recording)
    specs = [TaskSpec.from_task("boston")]
    replies = [("boston", "```python\n" + "x = 1\n" * (i + 1) + "```") for i in range(4)]  # unequal lengths
    kwargs = {"steps": 1, "batch_size": 4, "seed": 0, "learning_rate": 1e-2}
    a = warm_start(load_policy("tiny", seed=0), RawCodeScaffold(), specs, replies, **kwargs)  # type: ignore[arg-type]
    b = warm_start(load_policy("tiny", seed=0), RawCodeScaffold(), specs, replies, micro_batch_size=1, **kwargs)  # type: ignore[arg-type]
    assert b == pytest.approx(a, rel=1e-5) and len(grads) == 2
    for name, whole in grads[0].items():
        assert torch.allclose(whole, grads[1][name], rtol=1e-4, atol=1e-7), name
