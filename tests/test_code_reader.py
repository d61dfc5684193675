"""The world model reads code: live code, foreseen failures, formatting invariance, exploits,
the agent-style plan grammar and corpus, and the pinned solutions' runtime on both backends."""

from __future__ import annotations

import gzip
import json
import math
import random
import re

import numpy as np
import pytest
from sandbox_helpers import _docker_executor, executor, local_executor  # noqa: F401

from benchmarks.agent_fidelity import prior_script
from wmrl_envs.autoresearch.grading import grading_context
from wmrl_envs.autoresearch.leaderboard import logs_root
from wmrl_envs.autoresearch.plans import (
    EXPLOITS,
    FAMILIES,
    MISTAKES,
    Plan,
    render,
    render_exploit,
    sample_plan,
    space_size,
)
from wmrl_envs.autoresearch.tasks import get_task
from wmrl_envs.sandbox import Limits
from wmrl_envs.sandbox.runtime import RUNTIME_PINS, expected_versions, runtime_inventory, runtime_prompt_line
from wmrl_envs.world_models import CodeOutcomeModel, read_logs
from wmrl_envs.world_models.agent_corpus import (
    CORPUS_LIMITS,
    EXPLOIT_TABLES,
    HELDOUT_FAMILIES,
    HELDOUT_TABLES,
    agent_corpus_path,
    corpus_jobs,
    read_agent_corpus,
    split_of,
)
from wmrl_envs.world_models.code_reader import READING_FEATURES, live_source, read_script, table_columns


@pytest.fixture(scope="module")
def wm() -> CodeOutcomeModel:
    return CodeOutcomeModel.load_default()


def corpus_context(task_id: str) -> dict:
    """The grading context of an agent-corpus run (its tighter limits)."""
    task = get_task(task_id)
    cpu, memory = CORPUS_LIMITS[task.tier or "small"]
    return grading_context(task, limits={"wall_seconds": cpu, "memory_bytes": memory})


def predict(wm: CodeOutcomeModel, task_id: str, code: str, context: dict | None = None):
    return wm.predict([context or grading_context(get_task(task_id))], [code])[0]


# -- the reader -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "guard",
    [
        "if False:",
        "if 0:",
        "if len(train) < 0:",
        "if train.shape[0] < 0:",
        "if __name__ != '__main__':",
        "if 1 > 2:",
        "while False:",
    ],
)
def test_dead_branches_are_not_live(guard):
    code = f"import pandas as pd\ntrain = pd.read_csv('data/train.csv')\n{guard}\n    from sklearn.ensemble import RandomForestClassifier\n    RandomForestClassifier(n_estimators=500)\n"
    tree, text, dropped = live_source(code)
    assert "RandomForest" not in text and dropped >= 1


def test_uncalled_functions_and_code_after_exit_are_not_live():
    code = (
        "import sys\nimport pandas as pd\n"
        "def main():\n    pd.DataFrame({'a': [1]}).to_csv('submission.csv', index=False)\n"
        "def helper():\n    return 1\n"
        "x = helper()\nsys.exit(0)\nmain()\n"
    )
    _, text, _ = live_source(code)
    assert "to_csv" not in text and "def v" in text  # helper is used, main is not (the call after exit is dead)


def test_live_code_is_invariant_to_formatting_comments_and_names():
    a = "import numpy as np\nvalues = np.ones(3)\ntotal = values.sum()\nprint(total)\n"
    b = "# sum some ones\nimport numpy as np\n\n\nxs   =  np.ones( 3 )  # three\ns = xs.sum()\n\nprint(s)\n\n\n"
    assert live_source(a)[1] == live_source(b)[1]


def test_assignments_nothing_reads_are_not_live_unless_they_have_effects():
    code = (
        "import pandas as pd\ntrain = pd.read_csv('data/train.csv')\n"
        "cols = [c for c in train.columns]\nnum = [c for c in cols if c]\n"  # a chain nobody reads
        "model = make()\n_ = model.fit(train)\n"  # fit mutates the model: kept
        "train.drop(columns=['x'], inplace=True)\n"
        "pd.DataFrame({'id': train['id']}).to_csv('submission.csv', index=False)\n"
    )
    _, text, _ = live_source(code)
    assert "columns]" not in text and "for v" not in text  # both list comprehensions are gone
    assert ".fit(" in text and "inplace=True" in text and "to_csv" in text
    # reading a file can fail (the private answers are not in the sandbox): never a dead store
    reads = code.replace("model = make()", "answers = pd.read_csv('../private/answers.csv')\nmodel = make()")
    assert "../private/answers.csv" in live_source(reads)[1]
    # the reader still sees the dead store: a missing column dropped there is a foreseen failure
    bad = code.replace("num = [c for c in cols if c]", "rest = train.drop(columns=['no_such_column'])")
    assert "no_such_column" not in live_source(bad)[1]


def test_estimated_time_tracks_the_logged_cpu_time_of_long_runs():
    """The estimate behind ``read:log10_time_share`` (work per estimator family over that
    family's measured speed, plus startup) against the CPU time of every logged valid
    single-model run that took >= 10 CPU-s: within 10^0.5 for most and centred."""
    records = read_logs(sorted(logs_root().glob("*.jsonl"))) + read_agent_corpus()
    errors = []
    for r in records:
        cpu = (r.outcome.metrics or {}).get("cpu_seconds") if r.outcome and r.outcome.status == "valid" else None
        if not cpu or cpu < 10:
            continue
        f = read_script(r.code, r.context).features
        if f.get("read:n_models") == 1 and f.get("read:log10_estimated_seconds") == f.get(
            "read:log10_estimated_seconds"
        ):
            errors.append(f["read:log10_estimated_seconds"] - math.log10(cpu))
    assert len(errors) >= 30
    assert abs(float(np.median(errors))) < 0.25
    assert np.mean(np.abs(errors) < 0.5) >= 0.7, sorted(errors)


def test_reader_never_raises_on_odd_code():
    odd = [
        "x = (" * 50 + "1" + ")" * 50,
        "async def f():\n    await g()\n",
        "lambda: (yield)\n",
        "if True:\n    pass\nelse:\n    1 // 0\n",
        "import numpy as np\nnp.ones((10**9, 10**9))\n",
        "class A:\n    def __init__(self):\n        self.x = 1\nA()\n",
        "del x\n",
        "print(" * 3000,
        "",
    ]
    for code in odd:
        r = read_script(code, corpus_context("boston"))
        assert len(r.feature_vector()) == len(READING_FEATURES)


def test_table_columns_reads_the_inventory_and_the_submission_columns():
    t = table_columns(grading_context(get_task("wine")))
    assert t["complete"] and t["columns"]["cultivar"]["role"] == "target" and t["columns"]["id"]["role"] == "id"
    assert t["submission"] == ["id", "class_0", "class_1", "class_2"]
    assert table_columns(grading_context(get_task("attrition")))["submission"] == ["id", "Attrition"]


def test_foreseen_failures_never_contradict_a_logged_valid_run():
    """Precision of the gate on every catalog pool log (and the agent corpus when shipped):
    no script that really produced a valid submission is foreseen to fail."""
    records = read_logs(sorted(logs_root().glob("*.jsonl"))) + read_agent_corpus()
    checked = 0
    for r in records:
        if r.outcome is None or r.outcome.status != "valid":
            continue
        foreseen = read_script(r.code, r.context).foreseen
        assert foreseen is None, (r.task_id, r.solution_id, foreseen)
        checked += 1
    assert checked > 1000


# -- the world model flags each foreseeable failure kind ------------------------------------


def _plan(task_id: str, mistake: str, family: str = "pipeline", model: str = "hist_gb") -> str:
    task = get_task(task_id)
    params = {"learning_rate": 0.1, "max_iter": 100, "max_leaf_nodes": 31, "l2_regularization": 0.0}
    if model == "gb":
        params = {"n_estimators": 300, "learning_rate": 0.1, "max_depth": 5, "subsample": 0.8}
    return render(Plan(family=family, model=model, params=params, encode="onehot", mistakes=(mistake,) if mistake else (), search=("grid", 4, 3) if family == "search" else None), task)  # fmt: skip


def test_honest_script_is_predicted_valid(wm):
    assert predict(wm, "credit_data", _plan("credit_data", "")).status == "valid"


def test_missing_import_is_flagged(wm):
    o = predict(wm, "credit_data", "import catboost\n" + _plan("credit_data", ""))
    assert o.status == "runtime_error" and "catboost" in o.metrics["foreseen"]
    o = predict(wm, "credit_data", "from sklearn.preprocessing import TargetEncoderCV\n" + _plan("credit_data", ""))
    assert o.status == "runtime_error"
    o = predict(wm, "credit_data", _plan("credit_data", "").replace("sklearn.preprocessing", "sklearn.preprocess"))
    assert o.status == "runtime_error" and "sklearn.preprocess" in o.metrics["foreseen"]


def test_removed_keyword_is_flagged(wm):
    o = predict(wm, "credit_data", _plan("credit_data", "removed_keyword"))
    assert o.status == "runtime_error" and "sparse" in o.metrics["foreseen"]


def test_labels_for_a_probability_metric_are_flagged(wm):
    o = predict(wm, "credit_data", _plan("credit_data", "labels_for_proba"))  # roc_auc, classes good / bad
    assert o.status == "no_submission" and "probabilities" in o.metrics["foreseen"]


def test_onehot_memory_blow_up_is_flagged(wm):
    o = predict(wm, "births_day", _plan("births_day", "onehot_all_columns"), corpus_context("births_day"))
    assert o.status == "runtime_error" and o.metrics["p_status"].get("valid", 0.0) < 0.5


def test_polynomial_memory_blow_up_is_flagged(wm):
    o = predict(wm, "ames", _plan("ames", "poly_high_degree"), corpus_context("ames"))
    assert o.status != "valid" and o.metrics["p_status"].get("valid", 0.0) < 0.5


def test_polynomial_gate_counts_dummies_only_when_no_level_is_merged():
    """A degree-4 expansion of every dummy of auto_mpg's 225-level column is certainly over the
    limit; after a rare-level merge the width is unknown (the logged run was valid)."""
    lines = [
        "import pandas as pd",
        "from sklearn.preprocessing import PolynomialFeatures",
        'train = pd.read_csv("data/train.csv")',
        'full = train.drop(columns=["mpg", "id"])',
        "for c in ['name']:",
        "    counts = full[c].value_counts()",
        "    full[c] = full[c].where(full[c].map(counts) >= 5, 'rare')",
        "full = pd.get_dummies(full, columns=['name'], dtype=float)",
        "X = PolynomialFeatures(degree=4).fit_transform(full)",
        'pd.DataFrame({"id": train["id"], "mpg": X[:, 0]}).to_csv("submission.csv", index=False)',
    ]
    merged = read_script("\n".join(lines) + "\n", corpus_context("auto_mpg"))
    assert merged.foreseen is None
    unmerged = read_script("\n".join(lines[:4] + lines[7:]) + "\n", corpus_context("auto_mpg"))
    assert unmerged.foreseen is not None and "PolynomialFeatures" in unmerged.foreseen[1]


def test_search_time_blow_up_is_flagged(wm):
    o = predict(
        wm,
        "diamonds_price",
        _plan("diamonds_price", "huge_search", family="search", model="gb"),
        corpus_context("diamonds_price"),
    )
    assert o.status == "timeout"


def test_no_submission_is_flagged(wm):
    code = _plan("credit_data", "").replace('.to_csv("submission.csv", index=False)', ".head()")
    o = predict(wm, "credit_data", code)
    assert o.status == "no_submission" and "no reachable write" in o.metrics["foreseen"]


def test_whitespace_comments_and_names_do_not_move_a_prediction(wm):
    code = _plan("oj", "")
    renamed = re.sub(r"\bprep\b", "preprocessor", re.sub(r"\bmodel\b", "clf", code))  # names only, not imports
    noisy = "# a solution\n\n" + renamed.replace("\n", "\n\n") + "\n\n\n# end\n"
    a, b = predict(wm, "oj", code), predict(wm, "oj", noisy)
    assert a.score == b.score and a.status == b.status


# -- exploits -------------------------------------------------------------------------------


#: An exploit whose live code *is* a prior-only script (``impossible_condition``) reads exactly
#: as the prior script once its dead branch and the column lists nothing reads are left out.
PRIOR_TOLERANCE = 1e-9


@pytest.mark.parametrize("kind", EXPLOITS)
def test_no_exploit_scores_above_the_honest_prior_baseline(wm, kind):
    for task_id in EXPLOIT_TABLES:
        task = get_task(task_id)
        ctx = corpus_context(task_id)
        exploit = wm.predict([ctx], [render_exploit(kind, task)])[0]
        prior = wm.predict([ctx], [prior_script(task)])[0]
        assert exploit.score <= prior.score + PRIOR_TOLERANCE, (task_id, exploit.score, prior.score, exploit.feedback)


# -- plans and the corpus -------------------------------------------------------------------


def test_plan_space_is_large_and_renders_runnable_code_for_every_family():
    rng = random.Random(0)
    for task_id in ("boston", "credit_data", "wine", "digits"):
        task = get_task(task_id)
        assert space_size(task) >= 10_000
        codes = set()
        for family in FAMILIES:
            for _ in range(20):
                code = render(sample_plan(rng, task, families=[family]), task)
                compile(code, "main.py", "exec")
                codes.add(code)
        assert len(codes) >= 110  # 120 draws, nearly all distinct
    assert all(len(render_exploit(k, get_task("oj"))) > 100 for k in EXPLOITS)
    assert set(MISTAKES) >= {
        "labels_for_proba",
        "onehot_all_columns",
        "poly_high_degree",
        "huge_search",
        "missing_package",
    }


def test_corpus_jobs_are_deterministic_and_split_up_front():
    a = corpus_jobs(seed=0, tasks=["boston", "oj"])
    b = corpus_jobs(seed=0, tasks=["boston", "oj"])
    assert [j["job_id"] for j in a] == [j["job_id"] for j in b] and len(a) == len({j["job_id"] for j in a})
    assert {j["task_id"] for j in a if j["origin"] == "agent-exploit"} == {"oj"}
    assert split_of("oj", "agent-style", "pipeline") == "heldout"
    assert split_of("boston", "agent-style", HELDOUT_FAMILIES[0]) == "heldout"
    assert split_of("boston", "agent-style", "pipeline") == "train"
    assert split_of("boston", "agent-exploit", None) == "exploit"
    assert set(EXPLOIT_TABLES) <= set(HELDOUT_TABLES)


def test_growing_the_train_tables_with_a_new_seed_adds_new_scripts_and_no_held_out_table(monkeypatch):
    import wmrl_envs.world_models.agent_corpus as agent_corpus
    from wmrl_envs.world_models.cli import main

    calls = []
    monkeypatch.setattr(
        agent_corpus, "grow_agent_corpus", lambda *a, **kw: calls.append(kw) or {"done": 0, "ran": 0, "left": 0}
    )
    main(["grow-agent-corpus", "--train-tables", "--seed", "1"])
    tasks = calls[0]["tasks"]
    assert calls[0]["seed"] == 1 and tasks and not set(tasks) & set(HELDOUT_TABLES)
    fresh = corpus_jobs(seed=1, tasks=tasks[:2])
    assert not {j["job_id"] for j in fresh} & {j["job_id"] for j in corpus_jobs(seed=0, tasks=tasks[:2])}


def test_shipped_agent_corpus_has_real_outcomes_on_held_out_tables():
    path = agent_corpus_path()
    assert path.is_file(), "the agent corpus ships with the package"
    with gzip.open(path, "rt") as f:
        first = json.loads(f.readline())
    assert first["origin"] in ("agent-style", "agent-exploit") and "limits" in first["context"]
    held = read_agent_corpus(splits=["heldout"])
    known = [r for r in held if r.known]
    assert len(known) >= 200 and len({r.task_id for r in known if r.task_id in HELDOUT_TABLES}) >= 6
    assert len({r.outcome.status for r in known}) >= 4  # failures of several kinds, really run


# -- the pinned runtime ---------------------------------------------------------------------


def test_runtime_is_pinned_listed_in_prompts_and_inventoried():
    assert RUNTIME_PINS["scikit-learn"] >= "1.4"
    inv = runtime_inventory()
    assert inv["pins"] == dict(RUNTIME_PINS)
    assert "TargetEncoder" in inv["names"]["sklearn.preprocessing"] and "lightgbm" in inv["modules"]
    assert "sparse_output" in inv["params"]["OneHotEncoder"] and "sparse" not in inv["params"]["OneHotEncoder"]
    assert runtime_prompt_line() in get_task("boston").overview()


def test_both_backends_import_the_pinned_packages_at_the_pinned_versions(executor):  # noqa: F811
    script = (
        "import importlib, json\n"
        f"print(json.dumps({{m: importlib.import_module(m).__version__ for m in {sorted(expected_versions())!r}}}))\n"
    )
    result = executor.run(script, limits=Limits(wall_seconds=60, cpu_seconds=60, memory_bytes=1 << 30))
    assert result.ok, result.stderr_tail
    assert json.loads(result.stdout_tail) == expected_versions()


# -- landmarks of logs --------------------------------------------------------------------


def test_missing_landmarks_warn_and_are_refilled_from_the_task_directory(tmp_path):
    import numpy as np
    import pandas as pd

    from wmrl_envs.autoresearch.byo import task_from_frame
    from wmrl_envs.world_models.landmarks import with_landmarks
    from wmrl_envs.world_models.logs import LogRecord

    rng = np.random.default_rng(0)
    df = pd.DataFrame({"a": rng.normal(size=300), "b": rng.normal(size=300)})
    df["y"] = (df["a"] + rng.normal(scale=0.5, size=300) > 0).map({True: "yes", False: "no"})
    task = task_from_frame(df, "y", task_id="my_byo_table", root=tmp_path)
    record = LogRecord(task.task_id, "print(1)", {"task_id": task.task_id, "meta": {"n_train": 225}}, None)
    with pytest.warns(UserWarning, match="my_byo_table"):
        (kept,) = with_landmarks([record])
    assert "landmark_gain" not in kept.context["meta"]
    (filled,) = with_landmarks([record], task_root=tmp_path)
    assert "landmark_gain" in filled.context["meta"] and filled.context["meta"]["n_train"] == 225


def test_rich_plan_scaffold_round_trips_the_grammar_and_renders_scripts():
    from agents.llm.loading import rich_plan_replies
    from agents.llm.scaffolds import TaskSpec, make_scaffold
    from wmrl_envs.autoresearch.plans import plan_from_text, plan_to_text

    task = get_task("credit_data")
    rng = random.Random(1)
    for _ in range(200):
        plan = sample_plan(rng, task, mistake_rate=0.0)
        assert plan_from_text(plan_to_text(plan), task) == plan
    scaffold = make_scaffold("rich")
    spec = TaskSpec.from_task("credit_data")
    replies = rich_plan_replies(["credit_data", "boston"], n=12, seed=0)
    actions = {scaffold.to_action(scaffold.response_prefix + r, spec) for r in replies}
    assert len(actions) == 12 and all(a.startswith("```python") for a in actions)
    assert scaffold.to_action("family: nonsense", spec) == "family: nonsense"  # graded malformed
    # numbers snap to the grid; inapplicable choices fall back
    plan = plan_from_text("family: pipeline; model: forest; n_estimators: 280; target: log", task)
    assert plan.params["n_estimators"] == 300 and plan.target_transform == "none"


def test_dropped_columns_are_checked_only_on_frames_whose_columns_are_known():
    ctx = corpus_context("titanic")
    head = "import pandas as pd\ntrain = pd.read_csv('data/train.csv')\ntest = pd.read_csv('data/test.csv')\n"
    write = "pd.DataFrame({'id': test['id'], 'survived': 0}).to_csv('submission.csv', index=False)\n"
    missing = read_script(
        head + "X = train.drop(columns=['survived'])\nX = X.drop(columns=['customer_id'])\n" + write, ctx
    )
    assert missing.foreseen is not None and "customer_id" in missing.foreseen[1]
    assert "survived" in read_script(head + "Xt = test.drop(columns=['survived'])\n" + write, ctx).foreseen[1]
    # after get_dummies (or any transformation) the frame holds other columns: no claim
    dummies = head + "X = pd.get_dummies(train)\nX = X.drop(columns=['sex_male'])\n" + write
    assert read_script(dummies, ctx).foreseen is None


def test_an_svm_with_a_raw_kernel_on_unscaled_features_is_read_and_times_out_in_the_logs():
    """libsvm on raw feature scales: linear / polynomial kernels need orders of magnitude more
    iterations (RBF saturates). The reader says so; the logged agent-style runs agree."""
    svr = "from sklearn.svm import SVR\nm = SVR({})\nm.fit(X, y)\n"
    scaled = "from sklearn.preprocessing import StandardScaler\nX = StandardScaler().fit_transform(X)\n"

    def flag(code: str) -> float:
        return read_script(code, {}).features["read:svm_unscaled_kernel"]

    assert flag(svr.format("kernel='poly'")) == 1.0 and flag(svr.format("kernel='linear', C=10")) == 1.0
    assert flag(svr.format("")) == 0.0  # RBF, the default
    assert flag(scaled + svr.format("kernel='poly'")) == 0.0
    assert math.isnan(flag("from sklearn.linear_model import Ridge\nm = Ridge()\nm.fit(X, y)\n"))
    timeouts: dict[float, list[bool]] = {0.0: [], 1.0: []}
    for r in read_agent_corpus():
        if r.known and r.outcome.status in ("valid", "timeout"):
            v = read_script(r.code, r.context).features["read:svm_unscaled_kernel"]
            if not math.isnan(v):
                timeouts[v].append(r.outcome.status == "timeout")
    assert len(timeouts[1.0]) >= 10 and len(timeouts[0.0]) >= 10
    assert np.mean(timeouts[1.0]) >= 0.6 > 0.4 >= np.mean(timeouts[0.0]), {k: np.mean(v) for k, v in timeouts.items()}
