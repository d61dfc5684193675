"""Format collapse of the tiny rich-plan policy: a reproduction and a comparison of remedies.

A diagnostic experiment, not a benchmark. One arm of the full-tier speedup protocol
(benchmarks/configs/speedup-full-tier.toml: tiny policy, rich plan scaffold, lr 1e-3, 4 replies
per group, 96 new tokens) trained from a saved warm start for a fixed number of steps, without
the held-out evaluations and without a CPU budget; every reply's text and reward is logged.

    python docs/results/format-collapse/collapse.py run ARM STEPS WARM_START.pt RUN_DIR OUT.json '{"seed": 1, ...}'
    python docs/results/format-collapse/collapse.py table DIR

ARM is a speedup arm (``wm`` here: the world model grades, so a step costs generation only);
RUN_DIR holds the protocol's out-of-sample ``world_model/`` (docs/results/speedup-full-tier/);
the JSON overrides any ``GRPOConfig`` field (``groups_per_step``, ``beta``, ``learning_rate``,
``max_rollbacks``, ``seed``). ``run`` writes OUT.json (the loop's history) and
OUT.json.texts.jsonl (each step's replies and rewards); ``table`` summarises every
``x-<variant>-s<seed>.json.gz`` (OUT.json gzipped) in DIR into ``summary.json`` and ``malformed.png``.
"""

import gzip
import json
import sys
from pathlib import Path

import numpy as np

#: the last steps a run's end state is averaged over
TAIL = 25
#: the variant the others are compared with, seed by seed (the protocol as it ran)
BASELINE = "b0"


def run(arm: str, steps: int, warm: str, run_dir: str, out: str, overrides: dict) -> None:
    import torch

    from agents.grpo import train
    from agents.llm.loading import load_policy
    from agents.llm.scaffolds import make_scaffold
    from agents.llm.trainer import GRPOConfig, LLMAgent
    from benchmarks.speedup import _ARM_STACK, SpeedupConfig, _policy_tasks, _world_model
    from benchmarks.speedup_accounting import OutcomeCache
    from wmrl_envs.config_cli import build_config, load_config_file
    from wmrl_envs.vector import make_vector_env
    from wrappers import build_stack

    torch.set_num_threads(1)
    config = build_config(SpeedupConfig, load_config_file("benchmarks/configs/speedup-full-tier.toml"))
    train_tasks, eval_tasks = _policy_tasks(config)
    world_model, _ = _world_model(config, train_tasks + eval_tasks, Path(run_dir))
    policy = load_policy(config.policy, seed=0)
    policy.load_trainable_state_dict(torch.load(warm))
    policy.sync_backend()
    groups = overrides.pop("groups_per_step", 1 if arm == "real1" else config.groups_per_step)
    env = make_vector_env(
        "wmrl/AutoResearch-v0", groups * config.group_size, vectorization="sync", split="train",
        executor=OutcomeCache(), **config.env_kwargs(),
    )  # fmt: skip
    stack = build_stack(
        env, _ARM_STACK.get(arm, arm), world_model, anchor_fraction=config.anchor_fraction,
        anchor_min_per_step=config.anchor_min_per_step, seed=0, calibration=config.calibration(),
        anchor_selection="random", anchor_keep_share=config.anchor_keep_share,
    )  # fmt: skip
    protocol = dict(
        groups_per_step=groups, group_size=config.group_size, total_steps=steps,
        max_new_tokens=config.max_new_tokens, temperature=config.temperature, learning_rate=config.learning_rate,
        micro_batch_size=config.micro_batch_size, seed=0, progress=False, tensorboard=False, exploitation_guard=False,
    )  # fmt: skip
    grpo = GRPOConfig(**{**protocol, **overrides})
    texts = open(out + ".texts.jsonl", "w")
    collect = LLMAgent.collect

    def logged_collect(self, chosen, rng):
        episodes, metrics = collect(self, chosen, rng)
        texts.write(json.dumps([[e.texts[-1] if e.texts else None, e.reward] for e in episodes]) + "\n")
        texts.flush()
        return episodes, metrics

    LLMAgent.collect = logged_collect
    history = train(LLMAgent(policy, stack, make_scaffold(config.scaffold), grpo, tasks=train_tasks)).history
    stack.close()
    Path(out).write_text(json.dumps(history))


def _run_stats(history: list[dict]) -> dict:
    mal = np.array([h["reward/malformed_rate"] for h in history], dtype=float)
    reward = np.array([h["reward/mean"] or 0.0 for h in history], dtype=float)
    valid = np.array([h["reward/valid_rate"] for h in history], dtype=float)
    spell, longest = 0, 0
    for m in mal:
        spell = spell + 1 if m == 1.0 else 0
        longest = max(longest, spell)
    cpu = sum(
        h.get(k) or 0.0 for h in history for k in ("time/generation_cpu", "time/update_cpu", "time/wm_grading_cpu")
    )
    return {
        "steps": len(history),
        "all_malformed_share": float((mal == 1.0).mean()),
        "longest_all_malformed_spell": longest,
        "first_all_malformed_step": next((i + 1 for i, m in enumerate(mal) if m == 1.0), None),
        "malformed_rate_mean": float(mal.mean()),
        "tail_reward": float(reward[-TAIL:].mean()),
        "tail_valid_rate": float(valid[-TAIL:].mean()),
        "rollbacks": int(history[-1].get("train/rollbacks") or 0),
        "final_learning_rate": history[-1].get("train/learning_rate"),
        "cpu_s": float(cpu),
    }


def _mean_ci(values: list[float], seed: int = 0) -> dict:
    x = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    boots = rng.choice(x, size=(10000, len(x)), replace=True).mean(axis=1)
    return {"mean": float(x.mean()), "ci95": [float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975))]}


def _cell(stat: dict, fmt: str) -> str:
    return f"{stat['mean']:{fmt}} [{stat['ci95'][0]:{fmt}}, {stat['ci95'][1]:{fmt}}]"


def table(directory: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs: dict[str, dict[int, list[dict]]] = {}
    for path in sorted(directory.glob("x-*-s*.json.gz")):
        variant, seed = path.name.removesuffix(".json.gz")[2:].rsplit("-s", 1)
        runs.setdefault(variant, {})[int(seed)] = json.loads(gzip.decompress(path.read_bytes()))
    summary: dict = {"tail_steps": TAIL, "baseline": BASELINE, "variants": {}}
    baseline = {s: _run_stats(h) for s, h in runs[BASELINE].items()}
    keys = (
        "all_malformed_share",
        "longest_all_malformed_spell",
        "tail_reward",
        "tail_valid_rate",
        "rollbacks",
        "cpu_s",
    )
    print(
        "| variant | seeds | steps with every reply malformed | longest spell | tail reward | tail valid rate | "
        f"rollbacks | CPU-s | tail reward minus `{BASELINE}`, paired by seed |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    cols = 3
    rows = -(-len(runs) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.6 * rows), sharex=True, sharey=True, squeeze=False)
    for ax, (variant, by_seed) in zip(axes.flat, runs.items()):
        per_seed = {s: _run_stats(h) for s, h in sorted(by_seed.items())}
        agg = {k: _mean_ci([p[k] for p in per_seed.values()]) for k in keys}
        paired = _mean_ci([p["tail_reward"] - baseline[s]["tail_reward"] for s, p in per_seed.items()])
        summary["variants"][variant] = {
            "seeds": sorted(per_seed), "per_seed": per_seed, **agg, "tail_reward_minus_baseline": paired,
        }  # fmt: skip
        print(
            f"| {variant} | {len(per_seed)} | {_cell(agg['all_malformed_share'], '.2f')} | "
            f"{_cell(agg['longest_all_malformed_spell'], '.1f')} | {_cell(agg['tail_reward'], '.3f')} | "
            f"{_cell(agg['tail_valid_rate'], '.2f')} | {_cell(agg['rollbacks'], '.1f')} | {_cell(agg['cpu_s'], '.0f')} | "
            f"{_cell(paired, '+.3f')} |"
        )
        for s, h in sorted(by_seed.items()):
            mal = np.convolve([x["reward/malformed_rate"] for x in h], np.ones(5) / 5, mode="valid")
            ax.plot(np.arange(len(mal)) + 5, mal, lw=1, label=f"seed {s}")
        ax.set_title(variant, fontsize=9)
        ax.set_xlabel("step")
    for row in axes:
        row[0].set_ylabel("malformed (5-step mean)")
    axes.flat[0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(directory / "malformed.png", dpi=80)
    (directory / "summary.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    if sys.argv[1] == "run":
        arm, steps, warm, run_dir, out = sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
        run(arm, steps, warm, run_dir, out, json.loads(sys.argv[7]) if len(sys.argv) > 7 else {})
    elif sys.argv[1] == "table":
        table(Path(sys.argv[2]))
    else:
        raise SystemExit(__doc__)
