"""The full-size task tier: its split, data, limits, leaderboards and pool logs, and how the
task's own limits reach the sandbox (env, leaderboard builder, grading context)."""

from __future__ import annotations

import json
import math
import shutil

import gymnasium as gym
import pytest

import wmrl_envs  # noqa: F401  (registers the gym ids)
from wmrl_envs.autoresearch.catalog import CATALOG, FULL_CATALOG, FULL_LIMITS, catalog_split
from wmrl_envs.autoresearch.env import AutoResearchEnv
from wmrl_envs.autoresearch.grading import grading_context
from wmrl_envs.autoresearch.leaderboard import (
    LeaderboardConfig,
    build_leaderboards,
    load_leaderboard,
    logs_root,
    reference_pool,
)
from wmrl_envs.autoresearch.tasks import (
    DEFAULT_MEMORY_BYTES,
    DEFAULT_WALL_SECONDS,
    get_task,
    list_catalog,
    load_task,
    write_task,
)
from wmrl_envs.outcome import Outcome
from wmrl_envs.sandbox import ExecutionResult, default_executor

FULL = list_catalog(tier="full")


def _sources(ids):
    return {get_task(t).source for t in ids}


def test_full_tier_has_its_own_split_by_dataset():
    split = catalog_split("full")
    assert sorted(split["train"]) == list_catalog("train", tier="full") and sorted(split["test"]) == list_catalog(
        "test", tier="full"
    )
    assert len(split["train"]) >= 4 and len(split["test"]) >= 2 and sorted(split["train"] + split["test"]) == FULL
    assert set(split["train"]).isdisjoint(split["test"])
    assert _sources(split["train"]).isdisjoint(_sources(split["test"])), "no dataset in both splits"
    # no table leaks across tiers either: a full-tier train table is in no held-out task of either tier, and vice versa
    small = catalog_split("small")
    assert _sources(split["train"]).isdisjoint(_sources(small["test"]))
    assert _sources(split["test"]).isdisjoint(_sources(small["train"]))
    assert {get_task(t).task_type for t in FULL} == {"binary", "multiclass", "regression"}
    # the small tier stays the default everywhere
    assert list_catalog() == list_catalog(tier="small") == sorted(s.task_id for s in CATALOG)
    assert catalog_split() == catalog_split("small")
    assert set(list_catalog(tier=None)) == set(FULL) | set(list_catalog())
    with pytest.raises(ValueError, match="tier"):
        list_catalog(tier="huge")


def test_full_tier_tasks_are_full_size_and_carry_their_limits():
    assert len(FULL) >= 6 and FULL == sorted(s.task_id for s in FULL_CATALOG)
    for tid in FULL:
        task = get_task(tid)
        raw = json.loads((task.root / "task.json").read_text())
        assert raw["tier"] == "full" and raw["limits"] == FULL_LIMITS, tid
        assert task.run_limits() == {"wall_seconds": 120.0, "memory_bytes": 2 << 30}
        assert task.stats["n_train"] + task.stats["n_test"] >= 20_000, tid
        assert task.stats["onehot_width"] >= task.stats["n_cols"]
        # row counts on disk match the metadata; test ids match the hidden answers
        assert sum(1 for _ in open(task.public_dir / "train.csv")) - 1 == task.stats["n_train"]
        assert sum(1 for _ in open(task.private_dir / "answers.csv")) - 1 == task.stats["n_test"]
    # every shipped small task stores its limits too (what the env and the leaderboards always used)
    small = get_task("titanic")
    assert small.tier == "small" and small.run_limits() == {
        "wall_seconds": DEFAULT_WALL_SECONDS,
        "memory_bytes": DEFAULT_MEMORY_BYTES,
    }
    assert "limits" in json.loads((small.root / "task.json").read_text())


@pytest.mark.parametrize("tid", FULL)
def test_full_tier_leaderboards_and_pool_logs(tid):
    task = get_task(tid)
    board = load_leaderboard(tid)
    assert board is not None and len(board) >= 15, (tid, board and len(board))
    assert len(set(board)) >= 5
    entries = json.loads((task.private_dir / "leaderboard.json").read_text())["entries"]
    limit = task.run_limits()["wall_seconds"]
    assert all(0 < e["wall_seconds"] <= limit + 5 for e in entries)
    lines = [json.loads(line) for line in (logs_root() / f"{tid}.jsonl").read_text().splitlines()]
    pool = reference_pool(task)
    assert [r["solution_id"] for r in lines] == [s.solution_id for s in pool], (
        "one log line per pool script, every status"
    )
    ranked = {e["solution_id"] for e in entries}
    for rec, sol in zip(lines, pool):
        assert rec["context"]["limits"] == task.run_limits()
        assert rec["outcome"] is not None, (tid, sol.solution_id)  # the sandbox never failed as a harness
        out = Outcome.from_dict(rec["outcome"])
        if sol.reference:
            # a reference solution is on the board exactly when its run was valid
            assert (out.status == "valid") == (sol.solution_id in ranked), (tid, sol.solution_id, out.status)
        else:
            assert sol.solution_id not in ranked
        if out.metrics.get("exec_status") in ("killed_memory", "timeout"):
            assert out.status in ("runtime_error", "timeout") and out.score == 0.1 and out.feedback


def test_some_reference_solutions_die_of_memory_or_time_on_full_tables():
    """Real data for the world model: resource failures of reference solutions are logged, never ranked."""
    killed = {"killed_memory": 0, "timeout": 0}
    for tid in FULL:
        for line in (logs_root() / f"{tid}.jsonl").read_text().splitlines():
            rec = json.loads(line)
            status = rec["outcome"]["metrics"].get("exec_status")
            if status in killed and not rec["solution_id"].startswith("broken_"):
                killed[status] += 1
                assert "memory" in rec["outcome"]["feedback"] or "time" in rec["outcome"]["feedback"]
    assert killed["killed_memory"] >= 3, killed


def test_env_samples_only_the_requested_tier_and_split():
    ids = {i for i in gym.registry if i.startswith("wmrl/AutoResearch")}
    assert {f"wmrl/AutoResearch-{t}-v0" for t in FULL} <= ids
    for split in ("train", "test"):
        env = gym.make("wmrl/AutoResearch-v0", split=split, tier="full")
        seen = {env.reset(seed=s)[1]["task_id"] for s in range(25)}
        assert seen <= set(list_catalog(split, tier="full")) and len(seen) >= 2
        _, info = env.reset(seed=0)
        assert info["tier"] == "full" and info["wall_seconds"] == 120.0 and info["memory_bytes"] == 2 << 30
    default = gym.make("wmrl/AutoResearch-v0")  # unchanged for existing callers: small tier, train split
    assert {default.reset(seed=s)[1]["task_id"] for s in range(25)} <= set(list_catalog("train"))
    obs, info = gym.make(f"wmrl/AutoResearch-{FULL[0]}-v0").reset(seed=0)
    assert info["task_id"] == FULL[0] and "120 s budget" in obs
    with pytest.raises(ValueError, match="tier"):
        AutoResearchEnv(tier="medium")


class RecordingExecutor:
    """Records the limits of every call; runs the script for real in the sandbox when ``real``."""

    def __init__(self, real: bool = True):
        self.inner = default_executor() if real else None
        self.calls: list = []

    def run(self, script, inputs=None, outputs=(), limits=None):
        self.calls.append(limits)
        if self.inner is not None:
            return self.inner.run(script, inputs=inputs, outputs=outputs, limits=limits)
        sample = inputs["data/sample_submission.csv"].read_bytes()
        return ExecutionResult("ok", 0, "", "", 0.01, 0.01, None, files={"submission.csv": sample}, backend="recording")


_COPY_SAMPLE = "```python\nimport shutil\nshutil.copy('data/sample_submission.csv', 'submission.csv')\n```"


def test_task_limits_flow_into_the_executor_call():
    tid = list_catalog("test", tier="full")[0]
    ex = RecordingExecutor()
    env = AutoResearchEnv(tid, executor=ex, max_turns=1)
    env.reset(seed=0)
    *_, info = env.step(_COPY_SAMPLE)
    assert info["outcome"].status == "valid"  # ran for real in the sandbox
    assert (ex.calls[-1].wall_seconds, ex.calls[-1].cpu_seconds, ex.calls[-1].memory_bytes) == (120.0, 120.0, 2 << 30)
    env.reset(seed=0)  # the grading context (what a world model sees) carries the same limits
    assert env.grading_request(_COPY_SAMPLE).context["limits"] == {"wall_seconds": 120.0, "memory_bytes": 2 << 30}
    # a config value overrides the task's own limit, for every task
    env = AutoResearchEnv(tid, executor=ex, max_turns=1, wall_seconds=7.5, memory_bytes=1 << 30)
    env.reset(seed=0)
    env.step(_COPY_SAMPLE)
    assert (ex.calls[-1].wall_seconds, ex.calls[-1].memory_bytes) == (7.5, 1 << 30)
    # small-tier tasks keep what they always had
    env = AutoResearchEnv("titanic", executor=RecordingExecutor(real=False), max_turns=1)
    env.reset(seed=0)
    env.step(_COPY_SAMPLE)
    assert env.executor.calls[-1].wall_seconds == 60.0 and env.executor.calls[-1].memory_bytes == 2 << 30


def test_leaderboard_builder_runs_each_task_under_its_own_limits(tmp_path):
    """Plumbing only (a recording executor stands in for the sandbox): jobs and log contexts get the task's limits."""
    small = get_task("titanic")
    shutil.copytree(
        small.root, tmp_path / "tasks" / "titanic"
    )  # a copy: the builder writes leaderboard.json into the task dir
    train, test = small.read_train(), small.read_test().merge(small.read_answers(), on=small.id_column)
    own = write_task(
        tmp_path / "tasks",
        "titanic_limited",
        train,
        test,
        target=small.target,
        task_type="binary",
        metric="accuracy",
        question="q",
        source="s",
        licence="l",
        tier="full",
        limits={"wall_seconds": 90, "memory_bytes": 1 << 30},
    )
    assert own.run_limits() == {"wall_seconds": 90.0, "memory_bytes": 1 << 30}
    tasks = [load_task(tmp_path / "tasks" / "titanic"), own]
    ex = RecordingExecutor(real=False)
    config = LeaderboardConfig(size="small", logs_dir=tmp_path / "logs", timeout_probe_seconds=2.0)
    summary = build_leaderboards(tasks, ex, config)
    assert summary["titanic_limited"]["limits"] == {"wall_seconds": 90.0, "memory_bytes": 1 << 30}
    assert summary["titanic"]["limits"] == {"wall_seconds": 60.0, "memory_bytes": 2 << 30}
    limits = sorted({(lim.wall_seconds, lim.cpu_seconds, lim.memory_bytes) for lim in ex.calls})
    assert limits == [
        (2.0, 2.0, 2 << 30),
        (60.0, 60.0, 2 << 30),
        (90.0, 90.0, 1 << 30),
    ]  # timeout probe, small task, own limits
    line = json.loads((tmp_path / "logs" / "titanic_limited.jsonl").read_text().splitlines()[0])
    assert line["context"]["limits"] == {"wall_seconds": 90.0, "memory_bytes": 1 << 30}
    override = LeaderboardConfig(
        size="small", broken=False, write_logs=False, wall_seconds=30.0, memory_bytes=512 << 20
    )
    ex2 = RecordingExecutor(real=False)
    build_leaderboards([own], ex2, override)
    assert {(lim.wall_seconds, lim.memory_bytes) for lim in ex2.calls} == {(30.0, 512 << 20)}


def test_world_model_size_features_see_dense_one_hot_against_the_memory_limit():
    from wmrl_envs.world_models.features import SIZE_FEATURES, flat_context, size_features, summarize_script

    task = get_task("movies_rating")  # a nearly unique free-text column: one-hot is ~27k columns wide
    pool = {s.solution_id: s.code for s in reference_pool(task)}
    ctx = flat_context(grading_context(task))
    dense = summarize_script(pool["ridge_10.0"], task.task_type)
    trees = summarize_script(pool["rf_100"], task.task_type)
    (n_dense, rows, cells, share, over, per_second), tokens = size_features(ctx, dense)
    expected = 8 * task.stats["n_train"] * task.stats["onehot_width"] / (2 << 30)
    assert (
        len(SIZE_FEATURES) == 6 and n_dense == 1 and share == pytest.approx(expected) and share > 1
    )  # one dense copy exceeds 2 GiB
    assert (
        over == 1.0
        and rows == pytest.approx(math.log10(task.stats["n_train"]))
        and per_second == task.stats["n_train"] / 120
    )
    assert size_features(ctx, trees)[0][4] == 0.0  # ordinal-encoded trees build no dense one-hot matrix
    small = flat_context(grading_context(get_task("ames")))  # 74 columns, but 2,500 rows: far below the limit
    assert size_features(small, summarize_script(reference_pool("ames")[3].code, "regression"))[0][4] == 0.0
    assert "size:dense_onehot|cells=1e8" in tokens
    assert all(math.isnan(v) for v in size_features({}, dense)[0][1:])  # unknown sizes are NaN, never 0


def test_default_world_model_is_fitted_on_both_tiers_train_splits():
    from wmrl_envs.world_models import CodeOutcomeModel
    from wmrl_envs.world_models.corpus import read_corpus

    model = CodeOutcomeModel.load_default()
    tasks = set(model.info["tasks"])
    catalog = set(list_catalog("train", tier=None)) | set(list_catalog("test", tier=None))
    assert tasks & catalog == set(list_catalog("train", tier=None))  # every train-split task, no held-out one
    assert tasks - catalog == {r.task_id for r in read_corpus()}  # + the log corpus (tables outside the catalog)
    assert any(k.startswith("meta.landmark_") for k in model.featurizer.meta_keys)


def test_fidelity_reports_status_accuracy_on_memory_and_time_failures():
    from wmrl_envs.world_models.fidelity import failure_kind, fidelity_from_scores

    true = ["runtime_error", "runtime_error", "timeout", "valid", "valid", "runtime_error"]
    kinds = ["memory", "memory", "time", None, None, None]  # the last runtime_error is an ordinary crash
    pred = ["runtime_error", "valid", "timeout", "valid", "valid", "valid"]
    r = fidelity_from_scores(
        [0.1, 0.7, 0.1, 0.6, 0.8, 0.6],
        [0.1, 0.1, 0.1, 0.6, 0.9, 0.1],
        ["a"] * 6,
        pred,
        true,
        kinds,
        calibration_fraction=0.0,
    )
    assert (r.n_memory_failures, r.memory_failure_status_accuracy) == (2, 0.5)
    assert (r.n_time_failures, r.time_failure_status_accuracy) == (1, 1.0)
    assert r.status_accuracy == pytest.approx(4 / 6)
    none = fidelity_from_scores(
        [0.5, 0.6], [0.5, 0.6], ["a", "a"], ["valid"] * 2, ["valid"] * 2, calibration_fraction=0.0
    )
    assert none.n_memory_failures == 0 and none.memory_failure_status_accuracy is None  # unknown, not 0
    assert "| status accuracy, runs out of memory |" in none.to_markdown()
    assert failure_kind(Outcome("runtime_error", 0.1, metrics={"exec_status": "error"})) is None


def test_default_world_model_sees_memory_failures_coming_on_a_held_out_table():
    """births_day (held out): every dense one-hot reference solution died of memory for real;
    the shipped model predicts it, and still predicts the tree models as valid."""
    from wmrl_envs.world_models import CodeOutcomeModel

    task = get_task("births_day")
    assert task.split == "test"
    lines = {
        json.loads(line)["solution_id"]: json.loads(line)
        for line in (logs_root() / "births_day.jsonl").read_text().splitlines()
    }
    died = [sid for sid, r in lines.items() if r["outcome"]["metrics"].get("exec_status") == "killed_memory"]
    fine = [
        sid
        for sid in ("hgb_default", "rf_100", "tree_depth_8", "ridge_10.0")
        if lines[sid]["outcome"]["status"] == "valid"
    ]
    assert len(died) >= 5 and len(fine) == 3  # ridge on a dense one-hot of 7k levels is among the dead
    model = CodeOutcomeModel.load_default()
    pred = model.predict([lines[s]["context"] for s in died + fine], [lines[s]["code"] for s in died + fine])
    assert [p.status for p in pred[: len(died)]] == ["runtime_error"] * len(died)
    assert [p.status for p in pred[len(died) :]] == ["valid"] * len(fine)
