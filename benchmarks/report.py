"""Run directories and result writing shared by every experiment: JSON, Markdown tables, PNG plots.

Functions: :func:`make_run_dir`, :func:`write_json`, :func:`write_results`, :func:`markdown_table`, :func:`mean_spread`.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import platform
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["make_run_dir", "write_json", "write_results", "markdown_table", "mean_spread", "machine_summary"]


def machine_summary() -> dict[str, Any]:
    """What the numbers were measured on (goes into every result file)."""
    import os

    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def make_run_dir(root: str | Path, experiment: str) -> Path:
    """``root/<experiment>-<UTC timestamp>``, created."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    path = Path(root) / f"{experiment}-{stamp}"
    path.mkdir(parents=True, exist_ok=False)
    return path


def write_json(path: str | Path, payload: Any) -> Path:
    path = Path(path)
    path.write_text(json.dumps(payload, indent=2, default=_json_default) + "\n")
    return path


def write_results(run_dir: str | Path, result: dict[str, Any], markdown: str) -> dict[str, Any]:
    """Finish an experiment: ``result["markdown"] = markdown``, then ``results.json`` and ``results.md``."""
    run_dir = Path(run_dir)
    result["markdown"] = markdown
    write_json(run_dir / "results.json", result)
    (run_dir / "results.md").write_text(markdown + "\n")
    return result


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "__dataclass_fields__"):
        import dataclasses

        return dataclasses.asdict(obj)
    return str(obj)


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        if math.isnan(value):
            return "—"
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """A GitHub Markdown table of ``rows`` (dicts), columns in the given order.

    >>> print(markdown_table([{"arm": "real", "wall_s": 12.5}]))
    | arm | wall_s |
    |---|---|
    | real | 12.5 |
    """
    if not rows:
        return "(no rows)"
    columns = list(columns or rows[0].keys())
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def mean_spread(values: Iterable[float | None]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation over the known values (``None`` excluded)."""
    known = [float(v) for v in values if v is not None]
    if not known:
        return None, None
    return statistics.fmean(known), (statistics.stdev(known) if len(known) > 1 else 0.0)
