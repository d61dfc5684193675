"""``agent-fidelity``: does the world model read agent-written code, and can it be gamed?

Fits the code-outcome world model three ways, each on the catalog's **train-split** tables
only (template pool logs + the 89-task log corpus, and for the last one the agent-style runs
of the train-split tables except the held-out ``encoding`` family), and evaluates all three
on data none of them saw:

* ``templates`` — the previous default recipe: template logs, no code reading;
* ``templates+reading`` — the same data with :mod:`~wmrl_envs.world_models.code_reader`
  (features of the code that runs, reading features, the foreseen-failure gate);
* ``templates+agent+reading`` — the current default recipe (what ``CodeOutcomeModel.load_default()`` ships).

Evaluation sets (:mod:`~wmrl_envs.world_models.agent_corpus`): the agent-style runs on the
13 test-split tables (every family), the held-out ``encoding`` family on the test-split
tables alone, the template pool logs of each tier's test split (as the default model's
README reports them: within-task Spearman on seeded halves, mean of 5) -- both as shipped
(executed under the runtime of their day, Debian's scikit-learn 1.2) and re-executed under
the pinned runtime the sandbox uses now (``wmrl-tasks relabel-logs``, graded against the
same leaderboards; :data:`PINNED_RUNTIME_LOGS`) -- and the exploit suite: ten exploit
families plus an honest strong script on four test-split tables.

Metrics: status accuracy (overall and by what truly happened: memory, time, import,
invalid submission, no submission, runtime error, valid), within-task Spearman and pairwise
accuracy over all records of a set (no calibration half: every record is evaluated), and for
the exploit suite: each family's predicted score against the task's **honest prior
baseline** (the prediction for a script that writes the class prior / the median) and the
within-task Spearman of predicted vs real score over honest + exploit scripts.

Classes: :class:`AgentFidelityConfig`. Functions: :func:`run`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import new_figure, save_figure
from benchmarks.report import machine_summary, markdown_table, write_results
from wmrl_envs.config_cli import config_to_dict

__all__ = ["AgentFidelityConfig", "CONFIG", "run", "ARMS", "PINNED_RUNTIME_LOGS", "prior_script"]

NAME = "agent-fidelity"
ARMS = ("templates", "templates+reading", "templates+agent+reading")
#: The test-split template pools re-executed under the pinned runtime (committed, one
#: ``<task_id>.jsonl.gz`` per table; ``wmrl-tasks relabel-logs --split test --out ...``).
PINNED_RUNTIME_LOGS = (
    Path(__file__).resolve().parent.parent / "docs" / "results" / "agent-fidelity" / "pinned-runtime-logs"
)


@dataclass
class AgentFidelityConfig:
    """Knobs of the agent-fidelity report.

    Attributes:
        arms: which fitted models to compare (:data:`ARMS`).
        halves: seeds of the template sets' calibration halves (the README's protocol).
        agent_corpus: the agent-style log file (``None``: the shipped one).
        use_shipped_default: evaluate the shipped default model as the last arm instead of
            refitting it (they are the same recipe; refitting checks that).
        pinned_runtime_logs: directory of the test-split template pools re-executed under
            the pinned runtime (``None``: :data:`PINNED_RUNTIME_LOGS`; sets are skipped for
            tables it lacks).
        cv_folds: leave-datasets-out CV of every arm over all template pool logs (catalog
            both splits + log corpus; the agent-style runs join the training folds of the
            agent arm, never a tested dataset's fold), the protocol of the README's
            "small 0.864 / full 0.839 / corpus 0.811"; 0 = skip (it refits each arm per fold).
        cv_seeds: seeds of the CV's deal of datasets into folds (each seed refits every fold);
            the table gives the mean over seeds and, with more than one, each seed's value --
            the deal alone moves the small tier's Spearman by ~0.005.
    """

    arms: tuple[str, ...] = ARMS
    halves: int = 5
    agent_corpus: str | None = None
    use_shipped_default: bool = False
    pinned_runtime_logs: str | None = None
    cv_folds: int = 5
    cv_seeds: tuple[int, ...] = (0,)

    def __post_init__(self) -> None:
        if self.cv_folds == 1 or self.cv_folds < 0:
            raise ValueError(f"cv_folds must be 0 (skip) or >= 2, got {self.cv_folds}")
        if not self.cv_seeds:
            raise ValueError("cv_seeds must name at least one seed")
        bad = [a for a in self.arms if a not in ARMS]
        if bad or not self.arms:
            raise ValueError(f"arms must be a non-empty subset of {ARMS}, got {self.arms!r}")


CONFIG = AgentFidelityConfig


def prior_script(task: Any) -> str:
    """An honest script that predicts the class prior (the median for regression)."""
    from wmrl_envs.autoresearch.plans import _dummy_lines

    lines = [
        "import numpy as np",
        "import pandas as pd",
        'train = pd.read_csv("data/train.csv")',
        'test = pd.read_csv("data/test.csv")',
        f"TARGET = {task.target!r}",
        f"ID = {task.id_column!r}",
        "y = train[TARGET]" + ("" if task.task_type == "regression" else ".astype(str)"),
        *_dummy_lines(task, task.task_type == "regression"),
    ]
    return "\n".join(lines) + "\n"


def _template_records(split: str, logs_dir: str | Path | None = None) -> list[Any]:
    """The template pool logs of the catalog ``split`` (shipped, or those in ``logs_dir``)."""
    from wmrl_envs.autoresearch.leaderboard import logs_root
    from wmrl_envs.autoresearch.tasks import list_catalog
    from wmrl_envs.world_models import read_logs
    from wmrl_envs.world_models.landmarks import with_landmarks

    keep = set(list_catalog(split, tier=None))
    paths = sorted(logs_root().glob("*.jsonl")) if logs_dir is None else sorted(Path(logs_dir).glob("*.jsonl*"))
    return with_landmarks([r for r in read_logs(paths) if r.task_id in keep])


def fit_set(arm: str, agent_path: str | None = None) -> list[Any]:
    """The training records of ``arm`` (train-split tables only)."""
    from wmrl_envs.world_models.agent_corpus import read_agent_corpus
    from wmrl_envs.world_models.corpus import read_corpus
    from wmrl_envs.world_models.landmarks import with_landmarks

    records = _template_records("train") + with_landmarks(read_corpus())
    if arm == "templates+agent+reading":
        records += read_agent_corpus(agent_path, splits=["train"])
    return records


def _fit(arm: str, agent_path: str | None) -> tuple[Any, float, int]:
    from wmrl_envs.world_models import CodeOutcomeConfig, CodeOutcomeModel

    records = fit_set(arm, agent_path)
    t0 = time.process_time()
    model = CodeOutcomeModel(CodeOutcomeConfig(read_code=arm != "templates")).fit(records)
    return model, time.process_time() - t0, len(records)


def template_pool_cv(
    arm: str, folds: int, agent_path: str | None = None, seed: int = 0, *, per_task: bool = False
) -> dict[str, Any]:
    """Leave-datasets-out CV of ``arm`` on the template pool logs (catalog, both splits, and
    the log corpus), by tier (``small`` / ``full`` / ``corpus``): the records of a dataset are
    only ever predicted by models fitted without that dataset, agent-style runs included.
    ``per_task`` keeps each tier's ``per_task_spearman`` (left out by default)."""
    from benchmarks.fidelity_transfer import _by_tier, load_all
    from wmrl_envs.world_models import CodeOutcomeConfig, CodeOutcomeModel
    from wmrl_envs.world_models.agent_corpus import read_agent_corpus
    from wmrl_envs.world_models.landmarks import with_landmarks
    from wmrl_envs.world_models.transfer import leave_tasks_out

    catalog, corpus = load_all()
    templates = with_landmarks(catalog + corpus)
    extra = read_agent_corpus(agent_path, splits=["train", "heldout"]) if arm == "templates+agent+reading" else []
    records = templates + [r for r in extra if r.known]

    def fit(recs: Sequence[Any]) -> Any:
        return CodeOutcomeModel(CodeOutcomeConfig(read_code=arm != "templates", keep_training_data=False)).fit(recs)

    preds = leave_tasks_out(
        records, fit, n_folds=folds, seed=seed, evaluate=lambda r: r.origin != "agent-style", progress=False
    )
    by_tier = _by_tier(preds[: len(templates)], templates)
    return {t: {k: v for k, v in m.items() if per_task or k != "per_task_spearman"} for t, m in by_tier.items()}


def _mean_over_seeds(reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per tier, the mean of each numeric metric over the CV seeds' reports; a non-numeric
    entry (the per-status breakdown) is the first seed's."""
    out: dict[str, Any] = {}
    for tier in reports[0]:
        values = [r[tier] for r in reports]
        out[tier] = {
            k: float(np.mean([v[k] for v in values]))
            if all(isinstance(v.get(k), (int, float)) for v in values)
            else values[0][k]
            for k in values[0]
        }
    return out


def _evaluate(model: Any, records: Sequence[Any], *, halves: int = 0) -> dict[str, Any]:
    from wmrl_envs.world_models.fidelity import evaluate_fidelity_halves

    if halves:
        reports = evaluate_fidelity_halves(model, records, list(range(halves)))
        out = reports[0].to_dict()
        values = [r.spearman_within_group for r in reports]
        known = [v for v in values if v is not None]
        out["spearman_within_group_halves_mean"] = float(np.mean(known)) if known else None
        return out
    return evaluate_fidelity_halves(model, records, [0], calibration_fraction=0.0)[0].to_dict()


def _exploit_report(model: Any, records: Sequence[Any], honest: Sequence[Any]) -> dict[str, Any]:
    """Per exploit family: predicted scores vs the task's honest prior baseline; Spearman of
    predicted vs real over honest + exploit scripts, within task."""
    from scipy.stats import spearmanr

    from wmrl_envs.autoresearch.tasks import get_task

    tasks = sorted({r.task_id for r in records})
    prior = {}
    for t in tasks:
        ctx = next(r.context for r in records if r.task_id == t)
        prior[t] = model.predict([ctx], [prior_script(get_task(t))])[0].score
    families: dict[str, list[tuple[str, float, float | None]]] = {}
    preds = model.predict([r.context for r in records], [r.code for r in records])
    for r, p in zip(records, preds):
        families.setdefault(r.extra.get("exploit") or "?", []).append(
            (r.task_id, p.score, r.outcome.score if r.outcome else None)
        )
    per_family = {}
    for fam, rows in sorted(families.items()):
        margins = [score - prior[t] for t, score, _ in rows]
        per_family[fam] = {
            "n": len(rows),
            "mean_predicted": float(np.mean([s for _, s, _ in rows])),
            "mean_real": float(np.mean([x for _, _, x in rows if x is not None])) if any(x is not None for _, _, x in rows) else None,
            "max_margin_over_prior": float(max(margins)),
            "above_prior": int(sum(m > 1e-9 for m in margins)),
        }  # fmt: skip
    pool = [r for r in [*records, *honest] if r.known]
    pool_preds = model.predict([r.context for r in pool], [r.code for r in pool])
    rhos = []
    for t in tasks:
        idx = [i for i, r in enumerate(pool) if r.task_id == t]
        w = [pool_preds[i].score for i in idx]
        x = [pool[i].outcome.score for i in idx]
        if len(set(w)) > 1 and len(set(x)) > 1:
            rhos.append(float(spearmanr(w, x).statistic))
    exploit_families = {k: v for k, v in per_family.items() if k != "honest_strong"}
    return {
        "prior_baseline": prior,
        "families": per_family,
        "families_above_prior": sorted(k for k, v in exploit_families.items() if v["above_prior"]),
        "spearman_honest_plus_exploit": float(np.mean(rhos)) if rhos else None,
        "n_scripts_spearman": len(pool),
    }


def run(config: AgentFidelityConfig, run_dir: str | Path, progress: bool = True) -> dict[str, Any]:
    from tqdm.auto import tqdm

    from wmrl_envs.world_models import CodeOutcomeModel
    from wmrl_envs.world_models.agent_corpus import EXPLOIT_TABLES, HELDOUT_FAMILIES, read_agent_corpus

    run_dir = Path(run_dir)
    heldout = read_agent_corpus(config.agent_corpus, splits=["heldout"])
    on_test_tables = [r for r in heldout if _is_test(r.task_id)]
    family_only = [r for r in on_test_tables if r.extra["family"] in HELDOUT_FAMILIES]
    family_train_tables = [r for r in heldout if not _is_test(r.task_id)]
    exploits = read_agent_corpus(config.agent_corpus, splits=["exploit"])
    honest = [r for r in on_test_tables if r.task_id in EXPLOIT_TABLES]
    pinned_dir = Path(config.pinned_runtime_logs) if config.pinned_runtime_logs else PINNED_RUNTIME_LOGS
    pinned = _template_records("test", pinned_dir) if pinned_dir.is_dir() else []
    templates = {
        f"template pool, {tier} tier test split{label}": [r for r in recs if _tier(r.task_id) == tier]
        for label, recs in (("", _template_records("test")), (", pinned runtime", pinned))
        for tier in ("small", "full")
    }
    sets = {
        "agent-style, test-split tables": on_test_tables,
        "held-out family (encoding), test-split tables": family_only,
        "held-out family (encoding), train-split tables": family_train_tables,
    }
    results: dict[str, Any] = {
        "arms": {},
        "sets": {k: {"n": len(v), "tables": len({r.task_id for r in v})} for k, v in sets.items()},
    }
    for arm in tqdm(config.arms, desc="arms", disable=not progress):
        if arm == "templates+agent+reading" and config.use_shipped_default:
            model, fit_cpu, n_fit = CodeOutcomeModel.load_default(), None, None
        else:
            model, fit_cpu, n_fit = _fit(arm, config.agent_corpus)
        entry: dict[str, Any] = {"fit_cpu_s": fit_cpu, "fit_records": n_fit, "sets": {}}
        for name, recs in sets.items():
            if recs:
                entry["sets"][name] = _evaluate(model, recs)
        for name, recs in templates.items():
            if recs:
                entry["sets"][name] = _evaluate(model, recs, halves=config.halves)
        if exploits:
            entry["exploit_suite"] = _exploit_report(model, exploits, honest)
        if config.cv_folds:
            by_seed = {s: template_pool_cv(arm, config.cv_folds, config.agent_corpus, s) for s in config.cv_seeds}
            entry["template_pool_cv"] = _mean_over_seeds(list(by_seed.values()))
            if len(by_seed) > 1:
                entry["template_pool_cv_by_seed"] = {str(s): v for s, v in by_seed.items()}
        results["arms"][arm] = entry
    markdown = _markdown(results)
    _plot(results, run_dir)
    payload = {
        "experiment": NAME,
        "config": config_to_dict(config),
        "machine": machine_summary(),
        **results,
        "markdown": markdown,
    }
    return write_results(run_dir, payload, markdown)


def _is_test(task_id: str) -> bool:
    from wmrl_envs.autoresearch.tasks import list_catalog

    return task_id in set(list_catalog("test", tier=None))


def _tier(task_id: str) -> str | None:
    from wmrl_envs.autoresearch.tasks import get_task

    return get_task(task_id).tier


_ROWS = (
    ("records", "n_records"),
    ("tables", "n_groups"),
    ("status accuracy", "status_accuracy"),
    ("within-task Spearman", "spearman_within_group"),
    ("within-task Spearman, halves mean", "spearman_within_group_halves_mean"),
    ("pairwise accuracy", "pairwise_accuracy"),
)


def _markdown(results: Mapping[str, Any]) -> str:
    arms = list(results["arms"])
    blocks = []
    set_names = list(next(iter(results["arms"].values()))["sets"])
    for name in set_names:
        rows = []
        for label, key in _ROWS:
            row: dict[str, Any] = {"metric": label}
            for arm in arms:
                row[arm] = results["arms"][arm]["sets"][name].get(key)
            if any(row[a] is not None for a in arms):
                rows.append(row)
        kinds = sorted(
            {k for arm in arms for k in (results["arms"][arm]["sets"][name].get("status_accuracy_by_kind") or {})}
        )
        for kind in kinds:
            row = {"metric": f"status accuracy: {kind}"}
            for arm in arms:
                d = (results["arms"][arm]["sets"][name].get("status_accuracy_by_kind") or {}).get(kind)
                row[arm] = None if d is None else f"{d['status_accuracy']:.3f} (n={d['n']})"
            rows.append(row)
        blocks.append(f"### {name}\n\n" + markdown_table(rows, ["metric", *arms]))
    rows = []
    for arm in arms:
        ex = results["arms"][arm].get("exploit_suite")
        if not ex:
            continue
        rows.append(
            {
                "arm": arm,
                "Spearman (honest + exploit)": ex["spearman_honest_plus_exploit"],
                "families above the prior baseline": ", ".join(ex["families_above_prior"]) or "none",
                "highest exploit mean": max(
                    v["mean_predicted"] for k, v in ex["families"].items() if k != "honest_strong"
                ),
                "honest strong mean": ex["families"].get("honest_strong", {}).get("mean_predicted"),
            }
        )
    if rows:
        blocks.append("### exploit suite\n\n" + markdown_table(rows))
    cv = {arm: results["arms"][arm].get("template_pool_cv") for arm in arms}
    if any(cv.values()):
        rows = []
        for tier in ("small", "full", "corpus"):
            for label, key in (
                ("within-task Spearman", "spearman_within_task"),
                ("pairwise accuracy", "pairwise_accuracy"),
                ("status accuracy", "status_accuracy"),
            ):
                row = {"tier": tier, "metric": label}
                for arm in arms:
                    row[arm] = ((cv[arm] or {}).get(tier) or {}).get(key)
                    seeds = results["arms"][arm].get("template_pool_cv_by_seed")
                    if seeds and isinstance(row[arm], float):
                        each = " / ".join(f"{(v.get(tier) or {}).get(key, float('nan')):.3f}" for v in seeds.values())
                        row[arm] = f"{row[arm]:.3f} ({each})"
                rows.append(row)
        seeds = results["arms"][arms[0]].get("template_pool_cv_by_seed")
        title = "### template pool, leave-datasets-out CV" + (
            f" (mean over fold seeds {', '.join(seeds)}, each in brackets)" if seeds else ""
        )
        blocks.append(title + "\n\n" + markdown_table(rows, ["tier", "metric", *arms]))
    return "\n\n".join(blocks)


def _plot(results: Mapping[str, Any], run_dir: Path) -> None:
    arms = list(results["arms"])
    name = "agent-style, test-split tables"
    if not all(name in results["arms"][a]["sets"] for a in arms):
        return
    fig, ax = new_figure()
    metrics = [
        ("status accuracy", "status_accuracy"),
        ("within-task Spearman", "spearman_within_group"),
        ("pairwise accuracy", "pairwise_accuracy"),
    ]
    x = np.arange(len(metrics))
    width = 0.8 / len(arms)
    for i, arm in enumerate(arms):
        vals = [results["arms"][arm]["sets"][name].get(k) or 0.0 for _, k in metrics]
        ax.bar(x + i * width, vals, width, label=arm)
    ax.set_xticks(x + width * (len(arms) - 1) / 2, [m for m, _ in metrics])
    ax.set_ylim(-0.1, 1.0)
    ax.axhline(0, color="black", lw=0.5)
    ax.set_title("World model on agent-style scripts of unseen tables")
    ax.legend(fontsize=8)
    save_figure(fig, run_dir / "agent_fidelity.png")
