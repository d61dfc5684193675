"""TRL's ``GRPOTrainer`` through :mod:`agents.trl_adapter` against a real ``wmrl-serve`` process
(issue 28): 2 training steps of a tiny from-config model on CPU, rewards read from the server's
stack (world-model graded), TRL's generation groups as the stack's anchor groups (pairs recorded).
"""

from __future__ import annotations

import pytest

pytest.importorskip("trl")
pytest.importorskip("openenv")

import torch  # noqa: E402
from serve_helpers import Server, servers  # noqa: E402,F401

from agents.llm.scaffolds import TaskSpec  # noqa: E402
from agents.trl_adapter import (  # noqa: E402
    GroupCoordinator,
    environment_factory,
    prompt_text,
    stack_reward,
    task_dataset,
    tool_ready_tokenizer,
)
from wmrl_envs import smollm2  # noqa: E402
from wmrl_envs.autoresearch.env import AutoResearchEnv  # noqa: E402

TASKS = ["titanic", "penguins"]


def tiny_model(tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def warm_start(model, tokenizer, prompts: list[str], reply: str, steps: int = 30) -> float:
    """Supervised warm start on the trainer's own prompts (the project's tiny-plan policy does
    the same on its prompts): the random model learns to answer with a plan. Only the reply's
    positions go through the LM head (a 49k vocabulary over a long prompt is the cost)."""
    target = tokenizer(reply, add_special_tokens=False)["input_ids"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-2)
    model.train()
    loss = torch.tensor(0.0)
    for _ in range(steps):
        loss = torch.tensor(0.0)
        for prompt in prompts:
            ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            hidden = model.model(input_ids=torch.tensor([ids + target])).last_hidden_state
            logits = model.lm_head(hidden[0, len(ids) - 1 : -1])
            loss = loss + torch.nn.functional.cross_entropy(logits, torch.tensor(target)) / len(prompts)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return float(loss.detach())


def test_group_coordinator_follows_trls_batch_layout():
    c = GroupCoordinator(group_size=2, groups_per_step=2, run="r")
    assert [c.next("a") for _ in range(2)] == [("r-b0-g0", ["r-b0-g0", "r-b0-g1"]), ("r-b0-g0", None)]
    c.next("b")
    with pytest.raises(RuntimeError, match="different rows"):
        c.next("c")  # a group's second member on another row: TRL's layout was misread


def test_grpo_trainer_two_steps_through_the_wmrl_stack(servers, tmp_path):
    from trl import GRPOConfig, GRPOTrainer

    server = Server("--stack", "wmrl", "--anchor-fraction", "0.5")
    servers.append(server)
    tokenizer = tool_ready_tokenizer(smollm2.load_tokenizer())
    model = tiny_model(tokenizer)
    args = GRPOConfig(
        output_dir=str(tmp_path / "trl"), per_device_train_batch_size=4, num_generations=2, max_steps=2,
        max_completion_length=8, learning_rate=1e-4, logging_steps=1, report_to=[], save_strategy="no",
        use_cpu=True, bf16=False, temperature=0.5, seed=0,
    )  # fmt: skip
    factory = environment_factory(server.url, args, scaffold="plan")
    trainer = GRPOTrainer(
        model=model, reward_funcs=stack_reward, args=args, train_dataset=task_dataset(TASKS, repeats=4),
        processing_class=tokenizer, environment_factory=factory,
    )  # fmt: skip
    # warm start on exactly the prompts TRL will render (the reset text of the same env code
    # the server runs, plus the submit tool's schema)
    local = AutoResearchEnv(max_turns=1)
    infos = {t: local.reset(options={"task": t})[1] for t in TASKS}
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt_text("plan", "", TaskSpec.from_info(infos[t]))}],
            tools=trainer.tools, add_generation_prompt=True, tokenize=False, chat_template=trainer.chat_template,
        )
        for t in TASKS
    ]  # fmt: skip
    assert warm_start(model, tokenizer, prompts, " linear\n" + tokenizer.eos_token) < 0.5

    trainer.train()

    envs = trainer._environment_pool[None]
    graded = [i for env in envs for i in env.history if i.get("graded")]
    assert len(graded) == 4  # the last step's 4 rollouts (instances are reused per batch)
    sources = {i["source"] for i in graded}
    # one anchor group per step (the per-step floor): its members graded for real too, the
    # other group's rewards from the world model
    assert sources == {"wm", "env"} and sum(i["anchor"] for i in graded) == 2
    assert all(i["trajectory_reward"] == i["calibrated_score"] for i in graded if i["source"] == "wm")
    assert all(0.0 <= env.reward <= 1.0 for env in envs)
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    assert len(rewards) == 2
    metrics = server.get("/metrics")
    assert metrics["anchor_pairs_total"] >= 4  # one anchor group of 2 per step (the floor), 2 steps
    assert metrics["counters"]["wm_predictions"] >= 8 and metrics["anchor_share"] == 0.5
