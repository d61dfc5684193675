"""Why do informative anchor groups still teach nothing? A diagnostic run, not a benchmark.

Runs the full-tier protocol's ``wmrl-informative`` arm (benchmarks/configs/speedup-full-tier.toml)
for one seed and budget, with two hooks that change nothing it does: every group decision logs the
world model's preview of the members (script hash, predicted status, score, status
probabilities), and every anchor group logs its (calibrated, real) scores. Then summarises the log.

    python docs/results/informative-anchor-diagnosis/diagnose.py run RUN_DIR BUDGET_CPU_S SEED [--keep-share]
    python docs/results/informative-anchor-diagnosis/diagnose.py summary RUN_DIR/diag.jsonl
    python docs/results/informative-anchor-diagnosis/diagnose.py table docs/results/informative-anchor-diagnosis

RUN_DIR must hold ``world_model/`` and ``arms/start-seed{SEED}.json`` copied from
docs/results/speedup-full-tier/ (the warm start is recomputed: ~35 min on one core).
"""

import gzip
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import tomllib

from wmrl_envs.autoresearch.grading import LADDER
from wrappers.parts.monitor import anchor_group_stats


def run(run_dir: Path, budget: float, seed: int, keep_share: bool = False) -> None:
    import wrappers.anchor as anchor
    import wrappers.handle as handle
    from benchmarks.speedup import SpeedupConfig
    from benchmarks.speedup import run as run_speedup

    log = run_dir / "diag.jsonl"
    priority, stats = anchor.informative_priority, handle.anchor_group_stats

    def logged_priority(members, **kwargs):
        p = priority(members, **kwargs)
        rows = [
            {
                "h": None if action is None else hashlib.md5(str(action).encode()).hexdigest()[:8],
                "status": getattr(o, "status", None),
                "score": getattr(o, "score", None),
                "p_status": (getattr(o, "metrics", None) or {}).get("p_status"),
            }
            for action, o in members
        ]
        with log.open("a") as f:
            f.write(json.dumps({"kind": "preview", "priority": p, "members": rows}) + "\n")
        return p

    def logged_stats(results):
        results = list(results)
        with log.open("a") as f:
            for r in results:
                if r.get("anchor"):
                    f.write(
                        json.dumps({"kind": "anchor", "calibrated": r.get("calibrated"), "true": r.get("true")}) + "\n"
                    )
        return stats(results)

    anchor.informative_priority, handle.anchor_group_stats = logged_priority, logged_stats
    cfg = tomllib.loads(Path("benchmarks/configs/speedup-full-tier.toml").read_text())
    cfg.update(arms=["wmrl-informative"], seeds=[seed], budget_cpu_s=budget, eval_fractions=[0.0, 1.0], workers=1)
    cfg["anchor_keep_share"] = keep_share  # the protocol pins False
    run_speedup(SpeedupConfig(**cfg), run_dir)


def p_real_spread(members: list[dict]) -> float:
    """P(the group's real scores differ) if members fail independently with the world model's
    status probabilities and distinct valid scripts never score alike: 1 - P(every distinct
    script lands on the same fixed failure score)."""
    distinct = {m["h"]: m for m in members if m["h"] is not None and m["p_status"]}.values()
    same = sum(
        np.prod([sum(q for s, q in m["p_status"].items() if LADDER.get(s) == value) for m in distinct])
        for value in set(LADDER.values())
    )
    return float(1.0 - same)


def summary(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        records = [json.loads(line) for line in f]
    previews = [r for r in records if r["kind"] == "preview"]
    eligible = [r for r in previews if r["priority"] is not None]
    anchors = []
    for i, r in enumerate(records):
        if r["kind"] != "anchor":
            continue
        # an anchor group is logged as it completes, just after its step's previews (one-turn
        # episodes): the two records before it are that step's groups (the protocol's 2 per step)
        step = [p["priority"] for p in records[max(0, i - 2) : i] if p["kind"] == "preview"]
        stats = anchor_group_stats([{"anchor": True, "calibrated": r["calibrated"], "true": r["true"]}])
        pairs = [(c, t) for c, t in zip(r["calibrated"], r["true"]) if c is not None and t is not None]
        anchors.append(
            {
                "pairs": [[round(c, 3), round(t, 3)] for c, t in pairs],
                "informative": bool(stats["informative_groups"]),
                **{
                    reason: bool(stats[f"{reason}_groups"])
                    for reason in ("flat_calibrated", "flat_true", "single_pair")
                },
                "step_had_a_calibrated_spread_group": any(q is not None and q >= 1 for q in step),
            }
        )
    spreads = [p_real_spread(r["members"]) for r in eligible]
    return {
        "groups_decided": len(previews),
        "groups_with_two_distinct_scripts": len(eligible),
        # priority 1 since 4bc566c: the calibrated preview scores differ (logs before it hold 0 for all)
        "groups_with_a_calibrated_spread": sum(r["priority"] >= 1 for r in eligible),
        "anchor_groups": len(anchors),
        "informative_anchor_groups": sum(a["informative"] for a in anchors),
        "flat_true": sum(a["flat_true"] for a in anchors),
        "flat_calibrated": sum(a["flat_calibrated"] for a in anchors),
        "single_pair": sum(a["single_pair"] for a in anchors),
        "flat_calibrated_in_steps_with_a_calibrated_spread_group": sum(
            a["flat_calibrated"] and a["step_had_a_calibrated_spread_group"] for a in anchors
        ),
        "p_real_spread_quantiles_0_10_25_50_75_100": np.quantile(spreads, [0, 0.1, 0.25, 0.5, 0.75, 1])
        .round(3)
        .tolist()
        if spreads
        else None,
        "uninformative_anchor_groups": [a for a in anchors if not a["informative"]],
    }


def table(folder: Path) -> list[dict]:
    """One row per run whose log ``X.jsonl.gz`` has the run's ``summary.json`` beside it as
    ``X.summary.json``: the log's counts and the arm's steps, held-out score and anchor weight."""
    rows = []
    for log in sorted(folder.glob("*.jsonl.gz")):
        arm_summary = log.with_name(log.name.removesuffix(".jsonl.gz") + ".summary.json")
        if not arm_summary.exists():
            continue
        s = summary(log)
        arm = json.loads(arm_summary.read_text())["arms"]["wmrl-informative"]
        rows.append(
            {
                "run": log.name.removesuffix(".jsonl.gz"),
                "steps": arm["steps"],
                "final_heldout": round(arm["final_heldout_mean"], 3),
                "anchor_weight_mean": round(arm["anchor_weight_mean"], 2),
                **{
                    k: v
                    for k, v in s.items()
                    if k not in ("uninformative_anchor_groups", "p_real_spread_quantiles_0_10_25_50_75_100")
                },
                "informative_share": round(s["informative_anchor_groups"] / s["anchor_groups"], 3)
                if s["anchor_groups"]
                else None,
            }
        )
    return rows


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(Path(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), keep_share="--keep-share" in sys.argv[5:])
    elif sys.argv[1] == "table":
        for row in table(Path(sys.argv[2])):
            print(json.dumps(row))
    else:
        print(json.dumps(summary(Path(sys.argv[2])), indent=1))
