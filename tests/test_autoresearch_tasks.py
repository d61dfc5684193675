"""The shipped catalog, its leaderboards and pool logs; procedural and BYO tasks (no sandbox)."""

from __future__ import annotations

import json
from collections import Counter

import pandas as pd
import pytest

from wmrl_envs.autoresearch.byo import task_from_csv
from wmrl_envs.autoresearch.catalog import CATALOG, build_catalog, catalog_split
from wmrl_envs.autoresearch.leaderboard import load_leaderboard, logs_root, reference_pool
from wmrl_envs.autoresearch.procedural import ProceduralConfig, generate_frame, generate_task
from wmrl_envs.autoresearch.tasks import get_task, list_catalog
from wmrl_envs.outcome import AUTORESEARCH_STATUSES, Outcome


def test_catalog_size_types_and_licences():
    ids = list_catalog()
    assert len(ids) >= 24 and sorted(ids) == sorted(s.task_id for s in CATALOG)
    tasks = [get_task(t) for t in ids]
    types = Counter(t.task_type for t in tasks)
    assert min(types["binary"], types["multiclass"], types["regression"]) >= 5
    assert {t.metric for t in tasks} == {"accuracy", "roc_auc", "log_loss", "macro_f1", "rmse", "mae", "rmsle", "r2"}
    assert all(t.licence and t.source for t in tasks)
    assert any(t.stats["max_cardinality"] >= 100 for t in tasks), "a high-cardinality categorical task"
    assert sum(t.stats["missing_fraction"] > 0 for t in tasks) >= 4, "missing-value tasks"
    assert all(t.stats["n_train"] + t.stats["n_test"] <= 2500 for t in tasks), "small enough to train in seconds"


def test_catalog_split_is_fixed_and_disjoint():
    split = catalog_split()
    assert set(split["train"]).isdisjoint(split["test"])
    assert sorted(split["train"]) == list_catalog("train")
    assert sorted(split["test"]) == list_catalog("test")
    assert len(split["test"]) >= 8 and len(split["train"]) >= 16
    # no dataset in both: the source tables differ
    sources = {s: {get_task(t).source for t in split[s]} for s in split}
    assert sources["train"].isdisjoint(sources["test"])
    for s in split:
        assert {get_task(t).task_type for t in split[s]} == {"binary", "multiclass", "regression"}


def test_leaks_are_removed_and_private_answers_match_test_ids():
    wage = get_task("wage")
    assert "logwage" not in wage.read_train().columns and "logwage" in wage.dropped_columns
    assert not {"expenditure", "share"} & set(get_task("credit_card").read_train().columns)
    for tid in ("wage", "penguins", "credit_data"):
        t = get_task(tid)
        test, answers = t.read_test(), t.read_answers()
        assert t.target not in test.columns
        assert test[t.id_column].tolist() == answers[t.id_column].tolist()
        assert set(t.read_train()[t.id_column]).isdisjoint(test[t.id_column])


def test_catalog_rebuilt_with_the_shipped_seed_matches_and_another_seed_redraws_the_split(tmp_path):
    shipped = get_task("penguins")
    (same,) = build_catalog(tmp_path / "s0", only=["penguins"])
    (other,) = build_catalog(tmp_path / "s1", only=["penguins"], seed=1)
    pd.testing.assert_frame_equal(same.read_train(), shipped.read_train())
    pd.testing.assert_frame_equal(same.read_answers(), shipped.read_answers())
    # Another draw of the same task: same table, target, metric and sizes; other rows held out.
    assert (other.target, other.metric, other.run_limits()) == (shipped.target, shipped.metric, shipped.run_limits())
    assert len(other.read_train()) == len(shipped.read_train())
    assert list(other.read_train().columns) == list(shipped.read_train().columns)
    key = [c for c in shipped.read_train().columns if c not in (shipped.id_column, shipped.target)]
    other_rows, shipped_rows = (set(map(tuple, t.read_test()[key].astype(str).to_numpy())) for t in (other, shipped))
    assert other_rows != shipped_rows


def test_public_inputs_never_include_private_files():
    t = get_task("titanic")
    inputs = t.inputs()
    assert sorted(inputs) == ["data/description.md", "data/sample_submission.csv", "data/test.csv", "data/train.csv"]
    assert all(t.private_dir not in p.parents for p in inputs.values())


def test_shipped_leaderboards_have_at_least_30_executed_reference_solutions():
    for tid in list_catalog():
        board = load_leaderboard(tid)
        assert board is not None and len(board) >= 30, tid
        assert len(set(board)) >= 5, f"{tid}: a diverse pool gives diverse scores"
        entries = json.loads((get_task(tid).private_dir / "leaderboard.json").read_text())["entries"]
        assert all(e["wall_seconds"] > 0 for e in entries)
        pool_ids = {s.solution_id for s in reference_pool(tid)}
        assert {e["solution_id"] for e in entries} <= pool_ids


def test_pool_logs_cover_every_status_and_follow_the_contract():
    statuses = Counter()
    for tid in list_catalog():
        lines = (logs_root() / f"{tid}.jsonl").read_text().splitlines()
        assert len(lines) == len(reference_pool(tid))
        for line in lines:
            rec = json.loads(line)
            assert set(rec) == {"task_id", "solution_id", "code", "context", "outcome", "origin"}
            assert rec["task_id"] == tid and rec["origin"] == "leaderboard-pool"
            assert {"task_id", "overview", "meta", "turn", "history"} <= set(rec["context"])
            outcome = Outcome.from_dict(rec["outcome"])
            statuses[outcome.status] += 1
            if outcome.status == "valid":
                assert 0.5 <= outcome.score <= 1.0 and outcome.metrics["percentile"] is not None
    assert set(statuses) == set(AUTORESEARCH_STATUSES) - {"malformed"}


def test_best_reference_solution_tops_its_leaderboard_in_the_logs():
    rec = [json.loads(line) for line in (logs_root() / "penguins.jsonl").read_text().splitlines()]
    scores = {r["solution_id"]: r["outcome"]["score"] for r in rec}
    assert scores["majority"] < 0.7 < max(scores.values()) == 1.0


def test_procedural_generator_is_seeded_and_varied(tmp_path):
    a, spec_a = generate_frame(3)
    b, _ = generate_frame(3)
    pd.testing.assert_frame_equal(a, b)
    specs = [generate_frame(s)[1] for s in range(40)]
    assert {s["task_type"] for s in specs} == {"binary", "multiclass", "regression"}
    assert len({s["metric"] for s in specs}) >= 6
    assert len({s["n_rows"] for s in specs}) >= 30
    assert any(s["n_categorical"] > 0 for s in specs) and any(s["missing"] > 0.1 for s in specs)
    t1 = generate_task(3, tmp_path / "a")
    t2 = generate_task(3, tmp_path / "b")
    for name in ("train.csv", "test.csv", "sample_submission.csv"):
        assert (t1.public_dir / name).read_bytes() == (t2.public_dir / name).read_bytes()
    assert t1.origin == "procedural" and t1.task_id == "proc_000003"
    with pytest.raises(ValueError, match="lower bound"):
        ProceduralConfig(rows=(10, 5))


def test_byo_csv_to_task(tmp_path):
    src = get_task("carseats").read_train().drop(columns=["id"])
    csv = tmp_path / "shop sales.csv"
    src.to_csv(csv, index=False)
    t = task_from_csv(csv, "ShelveLoc", root=tmp_path / "tasks", metric="macro_f1", test_fraction=0.3)
    assert t.task_id == "shop_sales" and t.task_type == "multiclass" and t.origin == "byo"
    assert t.submission_columns == ["id", "ShelveLoc"]
    assert len(t.read_test()) == pytest.approx(0.3 * len(src), abs=1)
    r = task_from_csv(csv, "Sales", task_id="sales", root=tmp_path / "tasks")
    assert r.task_type == "regression" and r.metric == "rmse"
    with pytest.raises(ValueError, match="target column 'nope' not in the CSV"):
        task_from_csv(csv, "nope", root=tmp_path / "tasks")
    with pytest.raises(ValueError, match="metric 'rmse' needs a numeric target; 'ShelveLoc' is not numeric"):
        task_from_csv(csv, "ShelveLoc", metric="rmse", root=tmp_path / "tasks")


def test_unknown_task_error_lists_catalog():
    with pytest.raises(ValueError, match="unknown task 'nope'.*titanic"):
        get_task("nope")
