"""Metrics, submission validation messages, position score, reward ladder, action parsing (no sandbox)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from sklearn import metrics as skm

from wmrl_envs.autoresearch.env import parse_action
from wmrl_envs.autoresearch.grading import (
    SubmissionError,
    check_syntax,
    ladder_score,
    position_score,
    read_submission,
    score_submission,
    validate_submission,
)
from wmrl_envs.autoresearch.metrics import METRICS, get_metric, score
from wmrl_envs.autoresearch.tasks import get_task


# ---------------------------------------------------------------------------- metrics
def test_metric_values_match_hand_computation():
    assert score("accuracy", ["a", "b", "a", "a"], ["a", "b", "b", "a"]) == 0.75
    # macro F1 for classes a, b: F1(a) = 2*2/(2*2+1) = 0.8, F1(b) = 2*1/(2*1+1) = 2/3
    assert score("macro_f1", ["a", "b", "a", "a"], ["a", "b", "b", "a"], classes=["a", "b"]) == pytest.approx(
        (0.8 + 2 / 3) / 2
    )
    assert score("rmse", [1, 2, 3], [1, 2, 5]) == pytest.approx(math.sqrt(4 / 3))
    assert score("mae", [1, 2, 3], [2, 2, 1]) == pytest.approx(1.0)
    assert score("rmsle", [0, math.e - 1], [0, 0]) == pytest.approx(math.sqrt(0.5))
    assert score("r2", [1, 2, 3], [1, 2, 3]) == 1.0
    # ROC AUC: P(positive) ranks 1 of the 2x2 pairs wrong
    assert score("roc_auc", ["n", "p", "n", "p"], [0.1, 0.4, 0.5, 0.8], classes=["n", "p"]) == 0.75
    # log loss, binary P(positive) and multiclass matrix agree with sklearn
    y = ["n", "p", "p"]
    p = np.array([0.2, 0.7, 0.9])
    assert score("log_loss", y, p, classes=["n", "p"]) == pytest.approx(skm.log_loss([0, 1, 1], p))
    m = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8], [0.3, 0.4, 0.3]])
    assert score("log_loss", ["a", "c", "b"], m, classes=["a", "b", "c"]) == pytest.approx(skm.log_loss([0, 2, 1], m))


def test_log_loss_clips_certain_misses_to_a_finite_value():
    value = score("log_loss", ["n", "p"], np.array([1.0, 0.0]), classes=["n", "p"])
    assert math.isfinite(value) and value > 30


def test_metric_directions_and_unknown_names():
    assert {m for m, rec in METRICS.items() if rec.higher_is_better} == {"accuracy", "macro_f1", "roc_auc", "r2"}
    with pytest.raises(ValueError, match="unknown metric 'auc'.*known metrics"):
        get_metric("auc")
    with pytest.raises(ValueError, match="negative"):
        score("rmsle", [1.0], [-1.0])


# ---------------------------------------------------------------------------- validation
@pytest.fixture(scope="module")
def binary_task():
    return get_task("credit_data")  # roc_auc: proba_positive, classes (good, bad)


@pytest.fixture(scope="module")
def multiclass_task():
    return get_task("wine")  # log_loss: one column per class


@pytest.fixture(scope="module")
def label_task():
    return get_task("chile")  # accuracy: labels


def _ids(task):
    return task.read_answers()[task.id_column].tolist()


def _valid(task):
    ids = _ids(task)
    if task.submission_format == "proba_classes":
        return pd.DataFrame({task.id_column: ids, **{c: 1 / len(task.classes) for c in task.classes}})
    if task.submission_format == "label":
        return pd.DataFrame({task.id_column: ids, task.target: task.classes[0]})
    return pd.DataFrame({task.id_column: ids, task.target: 0.5})


def test_valid_submission_scores_and_is_order_insensitive(binary_task):
    sub = _valid(binary_task)
    assert score_submission(binary_task, sub) == 0.5  # constant scores -> AUC 0.5
    # Informative, distinct scores: rows are matched by id, so shuffling the rows of the file
    # keeps the score, while shuffling the scores against the ids destroys it.
    ans = binary_task.read_answers()
    truth = (ans[binary_task.target].astype(str) == binary_task.positive_class).to_numpy(dtype=float)
    noise = np.random.default_rng(0).uniform(0, 0.5, len(ans))
    informative = pd.DataFrame(
        {binary_task.id_column: ans[binary_task.id_column], binary_task.target: 0.25 + 0.5 * truth + noise * 0.4}
    )
    score = score_submission(binary_task, informative)
    assert score > 0.9
    assert score_submission(binary_task, informative.sample(frac=1.0, random_state=0)) == score
    misaligned = informative.assign(
        **{binary_task.target: informative[binary_task.target].sample(frac=1.0, random_state=0).to_numpy()}
    )
    assert score_submission(binary_task, misaligned) < 0.7


def test_perfect_submission_scores_perfectly(label_task, multiclass_task):
    ans = label_task.read_answers()
    assert score_submission(label_task, ans) == 1.0
    ans = multiclass_task.read_answers()
    onehot = pd.get_dummies(ans[multiclass_task.target]).astype(float)[list(multiclass_task.classes)]
    onehot.insert(0, multiclass_task.id_column, ans[multiclass_task.id_column])
    assert score_submission(multiclass_task, onehot) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (
            lambda s, t: s.rename(columns={t.target: "prediction"}),
            r"has columns \['id', 'prediction'\]; expected exactly \['id', 'Status'\] \(missing \['Status'\]; unexpected \['prediction'\]\)",
        ),
        (lambda s, t: s[[t.target, t.id_column]], r"wrong order"),
        (lambda s, t: pd.concat([s, s.iloc[:2]]), r"2 duplicate ids in 'id', e\.g\. \["),
        (lambda s, t: s.iloc[:-3], r"has 747 rows; expected 750 \(one per id of test.csv\); 3 test ids are missing"),
        (lambda s, t: s.assign(id=s["id"] + 100000), r"750 test ids are missing.*750 ids are not test ids"),
        (
            lambda s, t: s.assign(Status=[np.nan] + [0.5] * (len(s) - 1)),
            r"column 'Status' has 1 missing \(NaN\) values",
        ),
        (
            lambda s, t: s.assign(Status="high"),
            r"column 'Status' must be numeric; found non-numeric values such as \['high'\]",
        ),
        (lambda s, t: s.assign(Status=1.5), r"holds probabilities and must lie in \[0, 1\]"),
        (lambda s, t: s.assign(Status=np.inf), r"infinite values"),
    ],
)
def test_validation_messages_name_the_problem(binary_task, mutate, message):
    with pytest.raises(SubmissionError, match=message):
        validate_submission(binary_task, mutate(_valid(binary_task), binary_task), _ids(binary_task))


def test_validation_of_labels_and_probability_columns(label_task, multiclass_task):
    sub = _valid(label_task).assign(vote="maybe")
    with pytest.raises(
        SubmissionError, match=r"values that are not classes: \['maybe'\]; classes are \['A', 'N', 'U', 'Y'\]"
    ):
        validate_submission(label_task, sub, _ids(label_task))
    sub = _valid(multiclass_task).drop(columns=["class_2"])
    with pytest.raises(SubmissionError, match=r"missing \['class_2'\]"):
        validate_submission(multiclass_task, sub, _ids(multiclass_task))


def test_ids_compare_as_values_not_text(binary_task):
    sub = _valid(binary_task)
    sub[binary_task.id_column] = sub[binary_task.id_column].astype(float)  # 3.0 is id 3
    assert validate_submission(binary_task, sub, _ids(binary_task)).shape == (len(sub),)


def test_read_submission_rejects_empty_and_garbage():
    with pytest.raises(SubmissionError, match="is empty"):
        read_submission(b"  \n")
    with pytest.raises(SubmissionError, match="could not be parsed as CSV"):
        read_submission(b'id,x\n1,"unterminated\n')


def test_rmsle_task_rejects_negative_predictions():
    task = get_task("hitters")
    sub = pd.DataFrame({"id": _ids(task), "Salary": -1.0})
    with pytest.raises(SubmissionError, match="negative values; rmsle needs predictions >= 0"):
        validate_submission(task, sub, _ids(task))


# ---------------------------------------------------------------------------- ranking + ladder
def test_position_score_matches_mle_dojo_with_ties_in_submitters_favour():
    board = [0.9, 0.8, 0.8, 0.7]
    assert position_score(0.8, board, True) == 0.75  # ties with both 0.8 entries: only 0.9 is better
    assert position_score(0.95, board, True) == 1.0
    assert position_score(0.1, board, True) == 0.0
    assert position_score(0.8, board, False) == 0.75  # lower is better: only 0.7 is better
    with pytest.raises(ValueError, match="non-empty"):
        position_score(1.0, [], True)


def test_reward_ladder():
    assert ladder_score("malformed") == ladder_score("syntax_error") == 0.0
    assert ladder_score("runtime_error") == ladder_score("timeout") == 0.1
    assert ladder_score("no_submission") == 0.2
    assert ladder_score("valid", 0.0) == 0.5 and ladder_score("valid", 1.0) == 1.0
    assert ladder_score("valid", None) is None  # unknown rank is unknown, not 0
    with pytest.raises(ValueError, match="unknown AutoResearch status"):
        ladder_score("crashed")


def test_check_syntax():
    out = check_syntax("print(1")
    assert out.status == "syntax_error" and out.score == 0.0 and "line 1" in out.feedback
    assert check_syntax("print(1)") is None


# ---------------------------------------------------------------------------- action parsing
@pytest.mark.parametrize(
    "text, kind, payload",
    [
        ("I will fit a model.\n```python\nimport pandas\n```\nDone.", "execute", "import pandas\n"),
        ("```py\nx = 1\n```", "execute", "x = 1\n"),
        ("```\nx = 1\n```", "execute", "x = 1\n"),
        ("Let me look first.\nREQUEST_INFO: data_head\n", "request_info", "data_head"),
        ("REQUEST_INFO: a\nREQUEST_INFO: b", "malformed", "several REQUEST_INFO"),
        ("```python\na\n```\n```python\nb\n```", "malformed", "found 2 code blocks"),
        ("```bash\nls\n```", "malformed", "marked 'bash'"),
        ("```python\n\n```", "malformed", "empty"),
        ("just prose", "malformed", "no ```python code block"),
        (None, "malformed", "must be a string"),
    ],
)
def test_parse_action(text, kind, payload):
    parsed = parse_action(text)
    assert parsed.kind == kind
    assert payload in parsed.payload if kind == "malformed" else parsed.payload == payload
