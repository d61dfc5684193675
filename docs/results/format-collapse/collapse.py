"""Format collapse of the tiny rich-plan policy: a reproduction and a comparison of remedies.

A diagnostic experiment, not a benchmark. One arm of the full-tier speedup protocol
(benchmarks/configs/speedup-full-tier.toml: tiny policy, rich plan scaffold, lr 1e-3, 4 replies
per group, 96 new tokens) trained from a saved warm start for a fixed number of steps, without
the held-out evaluations and without a CPU budget; every reply's text and reward is logged.

    python docs/results/format-collapse/collapse.py run ARM STEPS WARM_START.pt RUN_DIR OUT.json '{"seed": 1, ...}'
    python docs/results/format-collapse/collapse.py table DIR
    python docs/results/format-collapse/collapse.py spells ARMS_DIR OUT.json

ARM is a speedup arm (``wm`` here: the world model grades, so a step costs generation only);
RUN_DIR holds the protocol's out-of-sample ``world_model/`` (docs/results/speedup-full-tier/);
the JSON overrides any ``GRPOConfig`` field (``groups_per_step``, ``beta``, ``learning_rate``,
``max_rollbacks``, ``seed``). ``run`` writes OUT.json (the loop's history) and
OUT.json.texts.jsonl (each step's replies and rewards); ``table`` summarises every
``x-<variant>-s<seed>.json.gz`` (OUT.json gzipped) in DIR into ``summary.json`` and ``malformed.png``;
``spells`` lists, per arm of a speedup run's ``arms/`` directory, the spells of >= SPELL_STEPS
steps with >= COLLAPSED_MALFORMED_RATE of the replies malformed (the speedup summary's
``collapsed_step_share`` threshold), and what each arm's updates weighed.
"""

import gzip
import json
import sys
from pathlib import Path

import numpy as np

from benchmarks.speedup import COLLAPSED_MALFORMED_RATE

#: the last steps a run's end state is averaged over
TAIL = 25
#: the variant the others are compared with, seed by seed (the protocol as it ran)
BASELINE = "b0"
#: a collapse spell in a protocol run: this many collapsed steps in a row
SPELL_STEPS = 10


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


def spells(arms_dir: Path, out: Path) -> None:
    """Collapse spells per arm x seed of a speedup run, beside two things that make one group
    weigh more in an update: a step whose update rests on one group with a learning signal
    (``real1`` trains on one group per step) and an anchor group's inverse-variance weight."""
    import math
    import re

    arms: dict[str, dict[int, dict]] = {}
    for path in sorted(arms_dir.glob("*-seed*.json.gz")):
        arm, seed = re.fullmatch(r"(.+)-seed(\d+)\.json\.gz", path.name).groups()
        history = json.loads(gzip.decompress(path.read_bytes()))["history"]
        mal = [h["reward/malformed_rate"] or 0.0 for h in history]
        found, i = [], 0
        while i < len(mal):
            j = i
            while j < len(mal) and mal[j] >= COLLAPSED_MALFORMED_RATE:
                j += 1
            if j - i >= SPELL_STEPS:
                found.append({"step": history[i]["step"], "steps": j - i, "to_the_end": j == len(mal)})
            i = max(j, i + 1)
        updates = [h for h in history if h.get("loss/grad_norm") is not None]
        weights = [h["anchor/weight"] for h in history if h.get("anchor/weight") is not None]
        arms.setdefault(arm, {})[int(seed)] = {
            "steps": len(history),
            "spells": found,
            "one_group_update_share": sum(h["groups/used"] - h["groups/degenerate"] == 1 for h in updates)
            / max(1, len(updates)),
            "max_anchor_weight": max(weights) if weights else None,
        }
    print(f"| arm | seeds with a spell (>= {SPELL_STEPS} steps >= {COLLAPSED_MALFORMED_RATE:.0%} malformed) | spells "
          "| ending the run | updates resting on one group | largest anchor weight (mean over seeds) |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|")
    for arm, by_seed in arms.items():
        hit = sum(bool(r["spells"]) for r in by_seed.values())
        n_spells = sum(len(r["spells"]) for r in by_seed.values())
        ending = sum(any(s["to_the_end"] for s in r["spells"]) for r in by_seed.values())
        one = np.mean([r["one_group_update_share"] for r in by_seed.values()])
        w = [r["max_anchor_weight"] for r in by_seed.values() if r["max_anchor_weight"] is not None]
        print(
            f"| {arm} | {hit} / {len(by_seed)} | {n_spells} | {ending} | {one:.2f} | {np.mean(w) if w else 1.0:.2f} |"
        )

    def one_sided_fisher(a: int, n_a: int, b: int, n_b: int) -> float:
        """P(>= a of the k runs with a spell fall in the first n_a) under no association."""
        k, n = a + b, n_a + n_b
        return sum(math.comb(n_a, x) * math.comb(n_b, k - x) for x in range(a, min(k, n_a) + 1)) / math.comb(n, k)

    uneven = [a for a in arms if a not in ("real", "wm")]
    a = sum(bool(r["spells"]) for arm in uneven for r in arms[arm].values())
    n_a = sum(len(arms[arm]) for arm in uneven)
    b = sum(bool(r["spells"]) for arm in ("real", "wm") if arm in arms for r in arms[arm].values())
    n_b = sum(len(arms[arm]) for arm in ("real", "wm") if arm in arms)
    test = {"weighted_or_one_group_arms": uneven, "with_spell": [a, n_a], "real_and_wm_with_spell": [b, n_b],
            "one_sided_fisher_p": one_sided_fisher(a, n_a, b, n_b)}  # fmt: skip
    print(f"runs with a spell: {a} / {n_a} ({', '.join(uneven)}) vs {b} / {n_b} (real, wm); "
          f"one-sided Fisher exact p = {test['one_sided_fisher_p']:.4f}")  # fmt: skip
    out.write_text(json.dumps({"spell_steps": SPELL_STEPS, "spell_malformed": COLLAPSED_MALFORMED_RATE,
                               "arms": arms, "test": test}, indent=1))  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1] == "run":
        arm, steps, warm, run_dir, out = sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
        run(arm, steps, warm, run_dir, out, json.loads(sys.argv[7]) if len(sys.argv) > 7 else {})
    elif sys.argv[1] == "table":
        table(Path(sys.argv[2]))
    elif sys.argv[1] == "spells":
        spells(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        raise SystemExit(__doc__)
