"""Issue 13: attacks on the host and on the hidden answers, run as an attacker would.

Every attack is a real hostile script run through the real sandbox (no mocks); the host
side is checked from the host (process table, work-dir base, cgroup counters), not from
what the script prints. Sections: bounded grading, cleanup and quota, strictness and
hidden answers, wall limit inside the sandbox, cgroup limits, bring-your-own tables.
"""

from __future__ import annotations

import dataclasses

import pytest
from sandbox_helpers import SMALL, TEST_UIDS, local_executor  # noqa: F401

from wmrl_envs.autoresearch.grading import (
    FEEDBACK_MAX_CHARS,
    SubmissionError,
    grade_script,
    outcome_from_execution,
    read_submission,
)
from wmrl_envs.autoresearch.tasks import get_task
from wmrl_envs.sandbox import ExecutionResult

GRADE = dataclasses.replace(SMALL, max_file_bytes=32 << 20, wall_seconds=20, cpu_seconds=10)


# ---------------------------------------------------------------------------- bounded grading
@pytest.fixture(scope="module")
def task():
    return get_task("credit_data")


def _grade(task, script, executor, limits=GRADE):
    out = grade_script(task, script, executor, [0.5, 0.6, 0.7], limits=limits)
    assert out is not None, "the grader itself must not fail on a hostile submission"
    return out


def test_wide_header_submission_is_refused_before_parsing(task, local_executor):  # noqa: F811
    # the original attack: one 2M-field header line in 4 MiB (used to cost ~2.2 GiB RSS)
    script = "open('submission.csv','w').write('c,' * (1 << 21) + '\\n')"
    out = _grade(task, script, local_executor)
    assert out.status == "no_submission" and out.score == 0.2
    assert "line 1 is 4.0 MiB long; the limit is 65536 bytes per line" in out.metrics["invalid_reason"]


def test_header_with_too_many_fields_names_the_expected_columns(task, local_executor):  # noqa: F811
    script = "open('submission.csv','w').write(','.join(f'c{i}' for i in range(5000)) + '\\n1\\n')"
    out = _grade(task, script, local_executor)
    reason = out.metrics["invalid_reason"]
    assert "header has 5000 fields; expected exactly ['id', 'Status']" in reason, reason


def test_oversized_submission_is_never_read_back(task, local_executor):  # noqa: F811
    script = "open('submission.csv','wb').write(b'0' * (17 << 20))"
    out = _grade(task, script, local_executor)
    assert out.status == "no_submission"
    assert out.metrics["invalid_reason"] == "submission.csv is 17825792 bytes; the limit is 16777216 bytes"


def test_oversized_output_reported_by_the_executor(local_executor):  # noqa: F811
    r = local_executor.run(
        "open('big.bin','wb').write(b'x' * 5000)",
        outputs=["big.bin"],
        limits=dataclasses.replace(SMALL, max_read_bytes=4096),
    )
    assert r.status == "ok" and r.files == {} and r.oversized_files == {"big.bin": 5000}


def test_many_lines_and_feedback_flood_are_capped(task, local_executor):  # noqa: F811
    script = "import sys\nsys.stdout.write('A' * 200000)\nopen('submission.csv','w').write('\\n' * 100000)"
    out = _grade(task, script, local_executor)
    assert out.status == "no_submission"
    assert "has 100000 lines; expected a header and" in out.metrics["invalid_reason"]
    assert len(out.feedback) <= FEEDBACK_MAX_CHARS


def test_bad_ids_message_is_capped(task):
    n = len(task.read_answers())
    rows = "".join(f"{'x' * 2000}{i},0.5\n" for i in range(n))
    result = ExecutionResult("ok", 0, "", "", 1.0, 1.0, None, files={"submission.csv": f"id,Status\n{rows}".encode()})
    out = outcome_from_execution(task, result, [0.5])
    reason = out.metrics["invalid_reason"]
    assert reason.startswith(f"submission.csv has {n} rows; expected {n}") and len(reason) <= 1000, reason
    assert reason.endswith("more characters cut]")
    with pytest.raises(SubmissionError, match="has 51 lines; expected a header and 10 rows"):
        read_submission(f"id,Status\n{rows[: 51 * 2000]}".encode(), expected_columns=["id", "Status"], expected_rows=10)


def test_valid_submission_still_scores(task, local_executor):  # noqa: F811
    script = (
        "import pandas as pd\n"
        "t = pd.read_csv('data/test.csv')\n"
        "pd.DataFrame({'id': t['id'], 'Status': 0.5}).to_csv('submission.csv', index=False)\n"
    )
    out = _grade(task, script, local_executor)
    assert out.status == "valid", out.feedback


def test_grader_peak_rss_is_bounded_on_maximal_submissions():
    from benchmarks.grader_bound import measure_payload

    for name in ("wide_header", "string_cells"):
        row = measure_payload(name, "flights_late")  # the largest shipped test set (12,000 rows)
        assert row["status"] == "no_submission"
        assert row["peak_rss"] <= 256 << 20, row
        assert row["peak_rss"] - row["baseline_rss"] <= 64 << 20, row
