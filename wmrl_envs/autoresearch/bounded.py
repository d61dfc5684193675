"""Bounded reading of an untrusted ``submission.csv``: shape checks before any parsing.

The submission is written by the solution, so it is as hostile as the solution. The host
process that grades it must spend memory and CPU bounded by the *task* (rows x columns of
a correct submission), never by what the solution chose to write. A 16 MiB file holding
one 2M-field header line used to cost the grader ~2.2 GiB RSS and ~28 s of CPU in
``pandas.read_csv``; every check below runs on the raw bytes first, in time linear in the
size (itself capped) and without building per-field objects, so a file that would be
expensive to parse is rejected before it is parsed.

Checks, in order (each fails with a one-line :class:`SubmissionLimitError` naming the limit):

1. size: at most :attr:`SubmissionLimits.max_bytes` bytes;
2. lines: at most ``expected_rows + 1 + slack_lines`` line breaks (header + one row per id);
3. line length: no line longer than :attr:`SubmissionLimits.max_line_bytes`;
4. header: at most ``len(expected_columns) + slack_columns`` comma-separated fields.

Then :func:`parse_bounded` parses with ``nrows`` capped, so the frame holds at most
``(expected_rows + slack) x (columns + slack)`` cells.

Classes: :class:`SubmissionLimits`, :class:`SubmissionLimitError`.
Functions: :func:`check_submission_shape`, :func:`parse_bounded`, :func:`cap_text`.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

__all__ = ["SubmissionLimits", "SubmissionLimitError", "check_submission_shape", "parse_bounded", "cap_text"]


class SubmissionLimitError(ValueError):
    """A submission that breaks a size/shape limit; the message names the limit."""


@dataclass(frozen=True)
class SubmissionLimits:
    """Limits on one submission file, applied before it is parsed.

    Attributes:
        max_bytes: largest file read at all (a larger one is not even read back from the
            sandbox). 16 MiB is ~100x the largest correct submission of the shipped tasks.
        max_line_bytes: longest line (header included).
        slack_lines: line breaks allowed beyond header + one per expected row (trailing
            blank lines); more rows than that cannot be a correct submission.
        slack_columns: header fields allowed beyond the expected columns (so the error can
            still list a few unexpected names).
        max_lines: line breaks allowed when the expected row count is not known.
        max_message_chars: longest error / feedback text produced from a submission.
    """

    max_bytes: int = 16 << 20
    max_line_bytes: int = 64 << 10
    slack_lines: int = 16
    slack_columns: int = 16
    max_lines: int = 1_000_000
    max_message_chars: int = 1000

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_line_bytes", "slack_lines", "slack_columns", "max_lines", "max_message_chars"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"SubmissionLimits.{name} must be an int >= 0, got {value!r}")


def cap_text(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    note = f"... [{len(text) - limit} more characters cut]"
    return text[: max(0, limit - len(note))] + note


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n} bytes"


def check_submission_shape(
    raw: bytes,
    *,
    name: str,
    expected_columns: Sequence[str] | None = None,
    expected_rows: int | None = None,
    limits: SubmissionLimits | None = None,
) -> None:
    """Raise :class:`SubmissionLimitError` if ``raw`` breaks a limit; cost O(len(raw)), no parsing.

    >>> check_submission_shape(b"id,y\\n1,0.5\\n", name="s.csv", expected_columns=["id", "y"], expected_rows=1)
    >>> check_submission_shape(b"id," * 100 + b"\\n", name="s.csv", expected_columns=["id", "y"])
    Traceback (most recent call last):
    ...
    wmrl_envs.autoresearch.bounded.SubmissionLimitError: s.csv header has 101 fields; expected exactly ['id', 'y'] (more than 18 fields is never a valid submission)
    """
    lim = limits or SubmissionLimits()
    if len(raw) > lim.max_bytes:
        raise SubmissionLimitError(f"{name} is {_mib(len(raw))}; the limit is {_mib(lim.max_bytes)}")
    # bytes.count / find run in C without allocating: the shape is known before any split
    breaks = raw.count(b"\n")
    if expected_rows is not None and breaks > expected_rows + 1 + lim.slack_lines:
        raise SubmissionLimitError(
            f"{name} has {breaks} lines; expected a header and {expected_rows} rows (one per test id)"
        )
    if breaks > lim.max_lines:  # also bounds the per-line loop below
        raise SubmissionLimitError(f"{name} has {breaks} lines; the limit is {lim.max_lines}")
    start, line_no = 0, 0
    while start <= len(raw):
        end = raw.find(b"\n", start)
        end = len(raw) if end < 0 else end
        line_no += 1
        if end - start > lim.max_line_bytes:
            raise SubmissionLimitError(
                f"{name} line {line_no} is {_mib(end - start)} long; the limit is {_mib(lim.max_line_bytes)} per line"
            )
        start = end + 1
    if expected_columns is not None:
        first = raw.find(b"\n")
        header = raw[: len(raw) if first < 0 else first]
        fields = header.count(b",") + 1
        allowed_fields = len(expected_columns) + lim.slack_columns
        if fields > allowed_fields:
            raise SubmissionLimitError(
                f"{name} header has {fields} fields; expected exactly {list(expected_columns)} "
                f"(more than {allowed_fields} fields is never a valid submission)"
            )


def parse_bounded(raw: bytes, *, max_rows: int | None) -> pd.DataFrame:
    """``pandas.read_csv`` of shape-checked bytes, reading at most ``max_rows`` rows. Text
    columns come back as Python strings (``object``): with pyarrow installed pandas >= 3 stores
    them as Arrow strings, and every set / map / lookup the grader makes then builds a fresh copy
    of each cell as a Python string (a 16 MiB string submission cost 110 MiB instead of 14)."""
    frame = pd.read_csv(io.BytesIO(raw), low_memory=False, nrows=max_rows, encoding_errors="replace")
    text = [c for c in frame.columns if pd.api.types.is_string_dtype(frame[c]) and frame[c].dtype != object]
    return frame.astype({c: object for c in text}) if text else frame
