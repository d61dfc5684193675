"""``ablation``: no correction / denoising only / debiasing only / both, on the same reward streams.

A controlled setting, affordable on CPU: GRPO batches are drawn from *logged* solutions with
known true outcomes (the AutoResearch pool execution logs of held-out tasks by default), so
the real-execution reward of every member is known without running anything. Each step
draws ``groups_per_step`` groups (a task, ``group_size`` of its logged solutions), an
:class:`~wrappers.AnchorScheduler` picks the anchor groups (same seed, same anchors for
every variant), and a world model scores every member once:

* ``learned``: the shipped fitted :class:`~wmrl_envs.world_models.CodeOutcomeModel`
  (fitted on train-split tasks, so held-out logs are unseen);
* ``noisy-oracle``: :class:`~wmrl_envs.world_models.NoisyOracle` over the logged truth with a
  known bias and noise (``oracle_bias``, ``oracle_sigma``).

All variants see exactly these streams (anchor groups: true scores; other groups: world-model
scores) and differ only in the corrections, which use the wrappers' own state machines:

* ``none``: raw world-model rewards, anchor weight 1;
* ``denoise``: raw rewards, Inverse-Variance weight (:class:`~wrappers.InverseVarianceWeighter`)
  fed with raw-vs-true disagreement once ``calibration_start_pairs`` pairs have arrived;
* ``debias``: Online Debiasing (:class:`~wrappers.OnlineDebiaser`) on every world-model
  score, weight 1;
* ``both``: the map and the weight fed with calibrated-vs-true disagreement after the first
  fit (what ``CalibrationWrapper`` does);
* ``wm-only`` (reference): no anchors at all, every group scored by the world model.

The measure is the error of the step's GRPO advantages (:func:`agents.grpo.group_advantages`)
against the advantages real execution would give the same members: the cosine between the
two advantage vectors (the policy gradient is linear in the advantages, so this is the
gradient alignment when per-sample score-function gradients are orthogonal) and the RMSE.
Steps use the map and weight as they stand when the step starts; its anchor pairs update
them afterwards. Reported over all steps and over the second half (after the corrections
have engaged).

``CalibrationWrapper`` has no switch to turn one correction off (and its weight is gated on
the map being fitted), hence the state machines are driven directly here.

Classes: :class:`AblationConfig`. Functions: :func:`run`, :func:`simulate`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
from tqdm.auto import tqdm

from benchmarks.common import config_to_dict, load_world_model, new_figure, save_figure, summarize_seeds
from benchmarks.report import machine_summary, markdown_table, write_results

__all__ = ["AblationConfig", "CONFIG", "VARIANTS", "run", "simulate", "load_records"]

NAME = "ablation"

#: Correction variants, in the paper's expected order of quality, plus the no-anchor reference.
VARIANTS = ("none", "denoise", "debias", "both", "wm-only")
WORLD_MODELS = ("learned", "noisy-oracle")
METRICS = ("cosine", "cosine_late", "rmse", "rmse_late", "anchor_share", "final_weight", "fitted_at_step")


@dataclass
class AblationConfig:
    """Knobs of the ablation (defaults: the paper's calibration constants, ~1 min on 2 cores).

    Attributes:
        world_models: world models to ablate: ``learned`` and/or ``noisy-oracle``.
        seeds: seeds (groups drawn, anchors, oracle noise); mean and spread over them.
        steps: simulated GRPO steps.
        groups_per_step: groups per step.
        group_size: members per group (logged solutions of one task).
        anchor_fraction: target share of anchor groups.
        anchor_min_per_step: floor of anchor groups per step.
        calibration_start_pairs: pairs before the first isotonic fit (paper: 200).
        calibration_refit_every: refit after this many new pairs (paper: 64).
        calibration_half_life: EMA half-life of the disagreement (paper: 64).
        calibration_freeze_after: anchor groups observed before the weight's scale freezes (paper: 32).
        scale_by_std: GRPO's std normalisation of advantages (false = Dr.GRPO).
        oracle_bias: bias preset of the noisy oracle (``identity`` or ``quadratic``).
        oracle_sigma: noise standard deviation of the noisy oracle.
        logs: execution-log JSONL files (none = the shipped pool logs).
        split: keep logged tasks of this catalog split (``test`` = held out from the learned model).
        learned_model: ``default`` or a saved CodeOutcomeModel directory.
    """

    world_models: tuple[str, ...] = WORLD_MODELS
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int = 200
    groups_per_step: int = 10
    group_size: int = 4
    anchor_fraction: float = 0.10
    anchor_min_per_step: int = 1
    calibration_start_pairs: int = 200
    calibration_refit_every: int = 64
    calibration_half_life: float = 64.0
    calibration_freeze_after: int = 32
    scale_by_std: bool = True
    oracle_bias: str = "quadratic"
    oracle_sigma: float = 0.15
    logs: tuple[str, ...] | None = None
    split: str | None = "test"
    learned_model: str = "default"

    def __post_init__(self) -> None:
        bad = [w for w in self.world_models if w not in WORLD_MODELS]
        if bad or not self.world_models:
            raise ValueError(f"world_models must be a non-empty subset of {WORLD_MODELS}, got {self.world_models!r}")
        for name in ("steps", "groups_per_step", "group_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.group_size < 2:
            raise ValueError("group_size must be >= 2 (GRPO advantages need two members)")
        if self.split not in (None, "train", "test"):
            raise ValueError(f"split must be 'train', 'test' or none, got {self.split!r}")


CONFIG = AblationConfig


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
    records = [r for r in read_logs(paths) if r.outcome.score is not None]
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


class _Variant:
    """One correction setting: its own debiaser and weighter, fed from the shared stream."""

    def __init__(self, name: str, config: AblationConfig) -> None:
        from wrappers import CalibrationConfig

        cal = CalibrationConfig(
            start_pairs=config.calibration_start_pairs, refit_every=config.calibration_refit_every,
            max_pairs=max(5000, config.calibration_start_pairs), half_life=config.calibration_half_life,
            freeze_after=config.calibration_freeze_after,
        )  # fmt: skip
        self.name = name
        self.debias = name in ("debias", "both")
        self.denoise = name in ("denoise", "both")
        self.anchors = name != "wm-only"
        self.debiaser = cal.debiaser()
        self.weighter = cal.weighter()
        self.fitted_at: int | None = None

    def scores(self, wm: Sequence[float | None]) -> list[float | None]:
        return self.debiaser.transform(wm) if self.debias else list(wm)

    @property
    def weight(self) -> float:
        return self.weighter.weight if self.denoise else 1.0

    def observe(self, step: int, groups: Sequence[tuple[list[float | None], list[float]]]) -> None:
        """Feed the anchor groups of a finished step: pairs to the map, then disagreement to the weight."""
        for wm, true in groups:
            self.debiaser.add([(w, t) for w, t in zip(wm, true)])
            if self.fitted_at is None and self.debiaser.n_seen >= self.debiaser.start_pairs:
                self.fitted_at = step
            if self.denoise and self.fitted_at is not None:
                known = [(c, t) for c, t in zip(self.scores(wm), true) if c is not None]
                self.weighter.observe([c for c, _ in known], [t for _, t in known])


def _predict(world_model: Any, records: Sequence[Any]) -> list[float | None]:
    outcomes = world_model.predict([r.context for r in records], [r.code for r in records])
    return [None if o is None else o.score for o in outcomes]


def _advantages(rewards: Sequence[float | None], gids: Sequence[int], sources: Sequence[str], weight: float, scale_by_std: bool) -> np.ndarray:
    from agents.grpo import group_advantages

    adv = group_advantages(rewards, gids, sources=sources, anchor_weight=weight, scale_by_std=scale_by_std).advantages
    return np.array([0.0 if a is None else a for a in adv])  # no advantage = no gradient from that member


def simulate(config: AblationConfig, by_task: Mapping[str, Sequence[Any]], wm_name: str, seed: int, *, learned: Any = None, progress: bool = False) -> dict[str, Any]:
    """One seed of one world model: per-variant advantage cosine / RMSE against real execution."""
    from wmrl_envs.world_models import LoggedOutcomes, NoisyOracle
    from wrappers import AnchorScheduler

    rng = np.random.default_rng([seed, 7])
    tasks = list(by_task)
    if wm_name == "noisy-oracle":
        truth = LoggedOutcomes([r for rs in by_task.values() for r in rs])
        oracle = NoisyOracle(truth, bias=config.oracle_bias, sigma=config.oracle_sigma, seed=seed)
        predict = lambda records: _predict(oracle, records)  # noqa: E731  (fresh noise per draw)
    else:
        cache = {t: _predict(learned, rs) for t, rs in by_task.items()}  # deterministic: score once
        index = {id(r): i for rs in by_task.values() for i, r in enumerate(rs)}
        predict = lambda records: [cache[records[0].task_id][index[id(r)]] for r in records]  # noqa: E731
    scheduler = AnchorScheduler(fraction=config.anchor_fraction, min_per_step=config.anchor_min_per_step, seed=seed)
    variants = [_Variant(v, config) for v in VARIANTS]
    cos: dict[str, list[float]] = {v: [] for v in VARIANTS}
    rmse: dict[str, list[float]] = {v: [] for v in VARIANTS}
    n_anchor = 0
    for step in tqdm(range(config.steps), desc=f"ablation {wm_name} seed {seed}", disable=not progress, leave=False):
        gids = list(range(config.groups_per_step))
        anchors = scheduler.begin_step(gids)
        for g in gids:
            scheduler.release(g)
        n_anchor += len(anchors)
        members = []
        for g in gids:
            task = tasks[int(rng.integers(len(tasks)))]
            pick = rng.choice(len(by_task[task]), size=config.group_size, replace=False)
            records = [by_task[task][int(i)] for i in pick]
            members.append((g, [r.outcome.score for r in records], predict(records)))
        flat_g = [g for g, true, _ in members for _ in true]
        true_flat = [t for _, true, _ in members for t in true]
        reference = _advantages(true_flat, flat_g, ["env"] * len(flat_g), 1.0, config.scale_by_std)
        anchor_groups = [(wm, true) for g, true, wm in members if g in anchors]
        for v in variants:
            rewards, sources = [], []
            for g, true, wm in members:
                real = v.anchors and g in anchors
                rewards += list(true) if real else v.scores(wm)
                sources += ["env" if real else "wm"] * len(true)
            adv = _advantages(rewards, flat_g, sources, v.weight, config.scale_by_std)
            norm = np.linalg.norm(adv) * np.linalg.norm(reference)
            if norm > 0:
                cos[v.name].append(float(adv @ reference / norm))
            rmse[v.name].append(float(np.sqrt(np.mean((adv - reference) ** 2))))
            if v.anchors:
                v.observe(step, anchor_groups)
    half = config.steps // 2
    out: dict[str, Any] = {}
    for v in variants:
        c, e = cos[v.name], rmse[v.name]
        out[v.name] = {
            "cosine": float(np.mean(c)) if c else None,
            "cosine_late": float(np.mean(c[half:])) if c[half:] else None,
            "rmse": float(np.mean(e)),
            "rmse_late": float(np.mean(e[half:])) if e[half:] else None,
            "anchor_share": n_anchor / (config.steps * config.groups_per_step) if v.anchors else 0.0,
            "final_weight": v.weight,
            "fitted_at_step": v.fitted_at if v.debias or v.denoise else None,
            "curve": c,
        }
    return out


def run(config: AblationConfig, run_dir: Path, *, progress: bool = True) -> dict[str, Any]:
    """Every world model x seed; writes ``results.json``, ``results.md``, ``ablation.png``."""
    started = time.perf_counter()
    by_task = load_records(config.logs, config.split, config.group_size)
    learned = load_world_model(config.learned_model) if "learned" in config.world_models else None
    rows: list[dict[str, Any]] = []
    curves: dict[str, dict[str, list[float]]] = {}
    work = [(w, s) for w in config.world_models for s in config.seeds]
    for wm_name, seed in tqdm(work, desc="ablation", disable=not progress):
        result = simulate(config, by_task, wm_name, seed, learned=learned, progress=progress)
        for variant, metrics in result.items():
            curve = metrics.pop("curve")
            curves.setdefault(f"{wm_name}/{variant}", []).append(curve)
            rows.append({"world_model": wm_name, "variant": variant, "seed": seed, **metrics})
    summary = []
    for wm_name in config.world_models:
        for row in summarize_seeds([r for r in rows if r["world_model"] == wm_name], "variant", METRICS):
            summary.append({"world_model": wm_name, **row})
    result = {
        "experiment": NAME,
        "config": config_to_dict(config),
        "machine": machine_summary(),
        "setting": "controlled: logged solutions (true outcomes known) + world-model scores; measure = GRPO advantage cosine/RMSE vs real execution",
        "tasks": {t: len(rs) for t, rs in by_task.items()},
        "total_wall_s": time.perf_counter() - started,
        "summary": summary,
        "per_seed": rows,
    }
    result["plots"] = [str(_plot(config, summary, run_dir / "ablation.png")), str(_plot_curves(config, curves, run_dir / "ablation_curves.png"))]
    return write_results(run_dir, result, tables(result))


def _pm(row: Mapping[str, Any], key: str, digits: int = 3) -> str | None:
    mean, sd = row.get(key), row.get(f"{key}_sd")
    if mean is None:
        return None
    return f"{mean:.{digits}f}" if not sd else f"{mean:.{digits}f} ± {sd:.{digits}f}"


def tables(result: Mapping[str, Any]) -> str:
    cfg = result["config"]
    rows = [
        {
            "world model": r["world_model"], "variant": r["variant"], "seeds": r["seeds"],
            "adv. cosine (all steps)": _pm(r, "cosine"), "adv. cosine (2nd half)": _pm(r, "cosine_late"),
            "adv. RMSE (all)": _pm(r, "rmse"), "adv. RMSE (2nd half)": _pm(r, "rmse_late"),
            "anchor share": _pm(r, "anchor_share"), "final weight": _pm(r, "final_weight"),
            "corrections engaged at step": _pm(r, "fitted_at_step", 0),
        }
        for r in result["summary"]
    ]  # fmt: skip
    note = (
        f"Setting: {result['setting']}. {len(result['tasks'])} tasks ({cfg['split'] or 'all'} split), {cfg['steps']} steps x "
        f"{cfg['groups_per_step']} groups x {cfg['group_size']} members, anchor fraction {cfg['anchor_fraction']} "
        f"(floor {cfg['anchor_min_per_step']}/step), calibration start {cfg['calibration_start_pairs']} pairs, "
        f"noisy oracle: {cfg['oracle_bias']} bias, sigma {cfg['oracle_sigma']}. Higher cosine / lower RMSE = closer to real-execution GRPO."
    )
    return markdown_table(rows) + "\n\n" + note


def _plot(config: AblationConfig, summary: Sequence[Mapping[str, Any]], path: Path) -> Path:
    fig, ax = new_figure(7.0, 4.0)
    width = 0.8 / len(config.world_models)
    for j, wm_name in enumerate(config.world_models):
        mine = {r["variant"]: r for r in summary if r["world_model"] == wm_name}
        xs = np.arange(len(VARIANTS)) + j * width
        ys = [mine[v]["cosine_late"] if mine[v]["cosine_late"] is not None else np.nan for v in VARIANTS]
        es = [mine[v]["cosine_late_sd"] or 0.0 for v in VARIANTS]
        ax.bar(xs, ys, width, yerr=es, capsize=3, label=wm_name)
    ax.set_xticks(np.arange(len(VARIANTS)) + width * (len(config.world_models) - 1) / 2, VARIANTS)
    ax.set_ylabel("advantage cosine vs real execution (2nd half)")
    ax.set_title(f"ablation at anchor fraction {config.anchor_fraction}")
    ax.legend()
    return save_figure(fig, path)


def _plot_curves(config: AblationConfig, curves: Mapping[str, list[list[float]]], path: Path, window: int = 10) -> Path:
    """Running mean (over ``window`` steps, averaged over seeds) of the advantage cosine."""
    fig, axes = new_figure(5.0 * len(config.world_models), 3.6, ncols=len(config.world_models))
    for ax, wm_name in zip(np.atleast_1d(axes), config.world_models):
        for v in VARIANTS:
            runs = [c for c in curves.get(f"{wm_name}/{v}", []) if c]
            if not runs:
                continue
            n = min(len(c) for c in runs)
            mean = np.mean([c[:n] for c in runs], axis=0)
            smooth = np.convolve(mean, np.ones(window) / window, mode="valid") if n >= window else mean
            ax.plot(np.arange(len(smooth)) + (n - len(smooth)), smooth, label=v)
        ax.axvline(config.steps // 2, color="grey", ls=":", lw=1)
        ax.set_title(wm_name)
        ax.set_xlabel("step")
        ax.set_ylabel("advantage cosine vs real")
    np.atleast_1d(axes)[0].legend(fontsize=8)
    return save_figure(fig, path)
