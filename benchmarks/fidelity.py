"""``fidelity``: how faithful each available world model is on held-out execution logs.

For each world model, :func:`wmrl_envs.world_models.evaluate_fidelity` compares its
predictions with the logged true outcomes of held-out tasks (catalog ``test`` split by
default; the shipped learned model was fitted on the ``train`` split): status accuracy,
pooled and within-group Spearman, the centred bias B and residual variance before and after
an isotonic calibration fitted on a seeded half of the records (what Online Debiasing
does), mean absolute error. Seeds vary the calibration split (and the oracle's noise); the
table shows mean ± sd over seeds.

World models:

* ``learned``: the shipped fitted :class:`~wmrl_envs.world_models.CodeOutcomeModel`
  (or ``learned_model``);
* ``lm``: :class:`~wmrl_envs.world_models.LMWorldModel` (SmolLM2-135M-Instruct, untuned,
  offline) on the first ``lm_max_records`` records (it is slow on CPU);
* ``noisy-oracle``: :class:`~wmrl_envs.world_models.NoisyOracle` over the logged truth with
  ``oracle_bias`` and ``oracle_sigma`` (a reference instrument of known bias and noise).

Classes: :class:`FidelityConfig`. Functions: :func:`run`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from agents.llm.loading import load_world_model
from benchmarks.common import new_figure, save_figure, summarize_seeds
from benchmarks.report import machine_summary, markdown_table, write_results
from wmrl_envs.config_cli import config_to_dict
from wmrl_envs.world_models import FidelityReport

__all__ = ["FidelityConfig", "CONFIG", "run", "MODELS"]

NAME = "fidelity"
MODELS = ("learned", "lm", "noisy-oracle")


def load_records(logs: Sequence[str] | None, split: str | None, group_size: int) -> dict[str, list[Any]]:
    """Logged records with a known true score, by task; tasks with fewer than ``group_size`` dropped."""
    from wmrl_envs.world_models import read_logs

    if logs:
        paths = [Path(p) for p in logs]
    else:
        from wmrl_envs.autoresearch.leaderboard import logs_root

        paths = sorted(logs_root().glob("*.jsonl"))
        if not paths:
            raise FileNotFoundError(f"no shipped pool logs in {logs_root()}; build them (wmrl-tasks) or pass --logs")
    records = [r for r in read_logs(paths) if r.known]
    if split is not None:
        from wmrl_envs.autoresearch import catalog_split

        keep = set(catalog_split()[split])
        records = [r for r in records if r.task_id in keep]
    by_task: dict[str, list[Any]] = {}
    for r in records:
        by_task.setdefault(r.task_id, []).append(r)
    by_task = {t: rs for t, rs in sorted(by_task.items()) if len(rs) >= group_size}
    if not by_task:
        raise ValueError(f"no task with >= {group_size} scored records in {len(paths)} log file(s) (split={split!r})")
    return by_task


@dataclass
class FidelityConfig:
    """Knobs of the fidelity report.

    Attributes:
        models: world models to report: ``learned``, ``lm``, ``noisy-oracle``.
        seeds: seeds of the calibration split and the oracle noise; mean and spread over them.
        calibration_fraction: share of records the isotonic calibration is fitted on.
        logs: execution-log JSONL files (none = the shipped pool logs).
        split: keep logged tasks of this catalog split (``test`` = held out).
        learned_model: ``default`` or a saved CodeOutcomeModel directory.
        lm_max_records: records the LM world model scores (first N, tasks interleaved).
        lm_max_new_tokens: generation budget of the LM world model per answer.
        oracle_bias: bias preset of the noisy oracle.
        oracle_sigma: noise standard deviation of the noisy oracle.
    """

    models: tuple[str, ...] = MODELS
    seeds: tuple[int, ...] = (0, 1, 2)
    calibration_fraction: float = 0.5
    logs: tuple[str, ...] | None = None
    split: str | None = "test"
    learned_model: str = "default"
    lm_max_records: int = 16
    lm_max_new_tokens: int = 96
    oracle_bias: str = "quadratic"
    oracle_sigma: float = 0.15

    def __post_init__(self) -> None:
        bad = [m for m in self.models if m not in MODELS]
        if bad or not self.models:
            raise ValueError(f"models must be a non-empty subset of {MODELS}, got {self.models!r}")
        if not 0.0 <= self.calibration_fraction < 1.0:
            raise ValueError(f"calibration_fraction must be in [0, 1), got {self.calibration_fraction}")


CONFIG = FidelityConfig

_METRICS = tuple(f.name for f in fields(FidelityReport) if f.name not in ("name", "status_accuracy_by_kind"))


def _interleave(by_task: Mapping[str, Sequence[Any]]) -> list[Any]:
    """Records task by task in round-robin order, so a prefix covers many tasks."""
    out, i = [], 0
    while any(i < len(rs) for rs in by_task.values()):
        out += [rs[i] for rs in by_task.values() if i < len(rs)]
        i += 1
    return out


def _model(name: str, config: FidelityConfig, records: Sequence[Any], seed: int) -> Any:
    from wmrl_envs.world_models import LMWorldModel, LMWorldModelConfig, LoggedOutcomes, NoisyOracle

    if name == "learned":
        return load_world_model(config.learned_model)
    if name == "lm":
        return LMWorldModel(LMWorldModelConfig(max_new_tokens=config.lm_max_new_tokens, num_threads=1))
    return NoisyOracle(LoggedOutcomes(records), bias=config.oracle_bias, sigma=config.oracle_sigma, seed=seed)


def run(config: FidelityConfig, run_dir: Path, *, progress: bool = True) -> dict[str, Any]:
    """Reports of every model x seed; writes ``results.json``, ``results.md``, ``fidelity.png``."""
    from wmrl_envs.world_models import evaluate_fidelity, fidelity_from_scores

    started = time.perf_counter()
    records = _interleave(load_records(config.logs, config.split, 1))
    rows: list[dict[str, Any]] = []
    seconds: dict[str, float] = {}
    for name in tqdm(config.models, desc="fidelity", disable=not progress):
        subset = records[: config.lm_max_records] if name == "lm" else records
        t0 = time.perf_counter()
        if name == "noisy-oracle":  # fresh noise per seed
            reports = [
                evaluate_fidelity(
                    _model(name, config, subset, s),
                    subset,
                    calibration_fraction=config.calibration_fraction,
                    seed=s,
                    name=name,
                )
                for s in config.seeds
            ]
        else:  # deterministic model: predict once, vary only the calibration split
            model = _model(name, config, subset, 0)
            outcomes = []
            for start in tqdm(range(0, len(subset), 64), desc=name, disable=not progress, leave=False):
                chunk = subset[start : start + 64]
                outcomes += model.predict([r.context for r in chunk], [r.code for r in chunk])
            reports = [
                fidelity_from_scores(
                    [None if o is None else o.score for o in outcomes], [r.outcome.score for r in subset], [r.task_id for r in subset],
                    [None if o is None else o.status for o in outcomes], [r.outcome.status for r in subset],
                    calibration_fraction=config.calibration_fraction, seed=s, name=name,
                )
                for s in config.seeds
            ]  # fmt: skip
        seconds[name] = time.perf_counter() - t0
        rows += [
            {"model": name, "seed": s, **{k: v for k, v in r.to_dict().items() if k != "name"}}
            for s, r in zip(config.seeds, reports)
        ]
    summary = summarize_seeds(rows, "model", _METRICS)
    for row in summary:
        row["predict_seconds"] = seconds[row["model"]]
    result = {
        "experiment": NAME,
        "config": config_to_dict(config),
        "machine": machine_summary(),
        "tasks": sorted({r.task_id for r in records}),
        "total_wall_s": time.perf_counter() - started,
        "summary": summary,
        "per_seed": rows,
    }
    result["plot"] = str(_plot(summary, run_dir / "fidelity.png"))
    return write_results(run_dir, result, tables(result))


def _cell(row: Mapping[str, Any], key: str) -> str | None:
    mean, sd = row.get(key), row.get(f"{key}_sd")
    if mean is None:
        return None
    if key.startswith("n_"):
        return f"{mean:.0f}"
    return f"{mean:.3f}" if not sd else f"{mean:.3f} ± {sd:.3f}"


def tables(result: Mapping[str, Any]) -> str:
    """One column per world model, one row per metric (as ``wmrl-wm fidelity``), mean ± sd over seeds."""
    rows = [{"metric": m, **{r["model"]: _cell(r, m) for r in result["summary"]}} for m in _METRICS]
    rows.append({"metric": "predict seconds", **{r["model"]: f"{r['predict_seconds']:.1f}" for r in result["summary"]}})
    cfg = result["config"]
    note = f"Held-out logs: {len(result['tasks'])} tasks ({cfg['split'] or 'all'} split); seeds {cfg['seeds']}; calibration fraction {cfg['calibration_fraction']}; LM world model on the first {cfg['lm_max_records']} records."
    return markdown_table(rows, ["metric"] + [r["model"] for r in result["summary"]]) + "\n\n" + note


def _plot(summary: Sequence[Mapping[str, Any]], path: Path) -> Path:
    keys = ("spearman_within_group", "bias_before", "bias_after", "mae_before", "mae_after")
    fig, ax = new_figure(7.0, 4.0)
    width = 0.8 / max(1, len(summary))
    for j, r in enumerate(summary):
        ys = [r[k] if r[k] is not None else np.nan for k in keys]
        es = [r[f"{k}_sd"] or 0.0 for k in keys]
        ax.bar(np.arange(len(keys)) + j * width, ys, width, yerr=es, capsize=3, label=r["model"])
    ax.set_xticks(
        np.arange(len(keys)) + width * (len(summary) - 1) / 2, [k.replace("_", "\n") for k in keys], fontsize=8
    )
    ax.set_title("world-model fidelity on held-out logs")
    ax.legend()
    return save_figure(fig, path)
