"""AutoResearchEnv: a Kaggle-style ML task as a multi-turn text Gymnasium env.

Each episode is one task. The observation is text: at reset, the task overview (research
question, data inventory, submission contract) plus how to reply; after each step, the
feedback of that turn. The action is text:

* **execute** -- a reply containing exactly one fenced code block (```` ```python ````,
  ```` ```py ```` or a bare ```` ``` ````). The script runs in the sandbox with the task's
  public files at ``./data/`` and must write ``./submission.csv``.
* **request_info** -- a reply with a line ``REQUEST_INFO: <topic>`` and no code block;
  topics: see :data:`INFO_TOPICS`. Free, never graded, never reveals hidden labels.
* **malformed** -- anything else (no block, several blocks). Scored 0.0 without running.

Scores follow the reward ladder (:mod:`wmrl_envs.autoresearch.grading`). Malformed replies
and syntax errors are decided exactly and for free in the env; only scripts that compile
produce a :class:`~wmrl_envs.seam.GradingRequest`, graded by :meth:`AutoResearchEnv.grade`
-- the one method a world model replaces (through ``pending_outcome``, see
:mod:`wmrl_envs.seam`). ``reward`` of a step is the increase of the running max of known
scores, so the episode return equals ``info["trajectory_reward"]`` (the max over attempts)
when it is known. Episodes terminate after ``max_turns`` turns (every reply is a turn).

Resource limits of one solution run: the task's own (``task.json`` ``limits``; small-tier
catalog tasks 60 s / 2 GiB, full-tier 120 s / 2 GiB, tasks without limits 60 s / 2 GiB),
unless :class:`AutoResearchConfig` sets ``wall_seconds`` / ``memory_bytes``, which then
apply to every task. :meth:`AutoResearchEnv.run_limits` says which limits a task gets.

Info keys: reset -- ``task_id``, ``group_id``, ``split``, ``tier``, the run limits ``wall_seconds`` / ``memory_bytes``
and the task's structured fields;
every step -- ``task_id``, ``group_id``, ``split``, ``turn``, ``action_type``, ``outcome``,
``graded``; final step -- ``trajectory_reward``, ``outcomes`` (malformed, syntax-error and
executed attempts, in order; an unknown outcome appears as ``None``).

Classes: :class:`AutoResearchConfig`, :class:`AutoResearchEnv`, :class:`ParsedAction`.
Functions: :func:`parse_action`. Constant: :data:`INFO_TOPICS`.

>>> import gymnasium as gym, wmrl_envs
>>> env = gym.make("wmrl/AutoResearch-titanic-v0")
>>> obs, info = env.reset(seed=0)
>>> info["task_id"], info["metric"]
('titanic', 'accuracy')
>>> obs, reward, terminated, truncated, info = env.step("REQUEST_INFO: metric")
>>> info["action_type"], reward
('request_info', 0.0)
"""

from __future__ import annotations

import re
import warnings
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from wmrl_envs.autoresearch.grading import check_syntax, grade_script, grading_context
from wmrl_envs.autoresearch.leaderboard import load_leaderboard
from wmrl_envs.autoresearch.metrics import get_metric
from wmrl_envs.autoresearch.tasks import TIERS, Task, get_task, list_catalog
from wmrl_envs.outcome import Outcome
from wmrl_envs.seam import GradingRequest, OutcomeSeam
from wmrl_envs.spaces import FreeText
from wmrl_envs.vector import known_info

__all__ = ["AutoResearchConfig", "AutoResearchEnv", "ParsedAction", "parse_action", "INFO_TOPICS"]

INFO_TOPICS = {
    "overview": "the task overview shown at reset",
    "data_head": "the first rows of train.csv",
    "column_stats": "summary statistics of every train.csv column",
    "target_distribution": "class counts or quantiles of the target",
    "metric": "the metric, its direction and the submission format",
    "sample_submission": "the first rows of sample_submission.csv",
    "leaderboard": "quantiles of the reference leaderboard's scores",
    "help": "how to reply",
}

_FENCE = re.compile(r"```([^\n`]*)\n(.*?)```", re.DOTALL)
_REQUEST = re.compile(r"^[ \t]*REQUEST_INFO:[ \t]*(\S*)[ \t]*$", re.MULTILINE)
_CODE_LANGS = ("", "python", "py", "python3")


@dataclass(frozen=True)
class ParsedAction:
    """What a reply asks for: ``kind`` in {execute, request_info, malformed}; ``payload`` is
    the script, the topic, or the reason the reply is malformed."""

    kind: str
    payload: str


def parse_action(action: Any, max_chars: int | None = None) -> ParsedAction:
    """Classify a reply (see the module docstring for the syntax).

    A reply longer than ``max_chars`` is ``malformed`` before anything else looks at it
    (compiling a few MB of statements costs GBs of memory and minutes).

    >>> parse_action("Plan: fit a model.\\n```python\\nprint(1)\\n```").kind
    'execute'
    >>> parse_action("REQUEST_INFO: data_head")
    ParsedAction(kind='request_info', payload='data_head')
    >>> parse_action("hello").kind
    'malformed'
    """
    if not isinstance(action, str):
        return ParsedAction("malformed", f"the action must be a string, got {type(action).__name__}")
    if max_chars is not None and len(action) > max_chars:
        return ParsedAction(
            "malformed",
            f"the reply is {len(action)} characters long; the limit is max_action_chars={max_chars}",
        )
    blocks = _FENCE.findall(action)
    if len(blocks) == 1:
        lang, code = blocks[0]
        if lang.strip().lower() not in _CODE_LANGS:
            return ParsedAction("malformed", f"the code block is marked {lang.strip()!r}; use ```python")
        if not code.strip():
            return ParsedAction("malformed", "the code block is empty")
        return ParsedAction("execute", code)
    if len(blocks) > 1:
        return ParsedAction("malformed", f"found {len(blocks)} code blocks; send exactly one ```python block")
    requests = _REQUEST.findall(action)
    if len(requests) == 1:
        return ParsedAction("request_info", requests[0])
    if len(requests) > 1:
        return ParsedAction("malformed", "found several REQUEST_INFO lines; ask for one topic per turn")
    return ParsedAction("malformed", "no ```python code block and no `REQUEST_INFO: <topic>` line found")


@dataclass(frozen=True)
class AutoResearchConfig:
    """Settings of :class:`AutoResearchEnv`.

    Attributes:
        max_turns: turns per episode (K); every reply counts. Default 4.
        wall_seconds: time budget of one solution run (wall and CPU). Default ``None``: the
            task's own limit (:meth:`~wmrl_envs.autoresearch.tasks.Task.run_limits`; 60 s for
            small-tier and tasks without limits, 120 s for full-tier tasks). A number
            overrides it for every task.
        memory_bytes: memory cap of one solution run. Default ``None``: the task's own
            (2 GiB for every shipped task). A number overrides it for every task.
        max_obs_chars: observation length cap. Default 8000.
        max_action_chars: action length cap (the action space's ``max_length``), enforced at
            the env boundary: a longer reply is ``malformed`` (its feedback names the cap)
            before it is parsed, compiled or shown to a world model. Default 32768.
        overview_chars: cap of the task overview inside observations and grading contexts.
            Default 2500 (the pool logs were built with it, so world models see the same text).
    """

    max_turns: int = 4
    wall_seconds: float | None = None
    memory_bytes: int | None = None
    max_obs_chars: int = 8000
    max_action_chars: int = 32768
    overview_chars: int = 2500

    def __post_init__(self) -> None:
        if not isinstance(self.max_turns, int) or self.max_turns < 1:
            raise ValueError(f"max_turns must be an int >= 1, got {self.max_turns!r}")
        if self.wall_seconds is not None and not self.wall_seconds > 0:
            raise ValueError(f"wall_seconds must be > 0 or None (the task's own limit), got {self.wall_seconds!r}")
        if self.memory_bytes is not None and not (isinstance(self.memory_bytes, int) and self.memory_bytes >= 16 << 20):
            raise ValueError(
                f"memory_bytes must be an int >= 16 MiB or None (the task's own limit), got {self.memory_bytes!r}"
            )
        if self.max_obs_chars < 500:
            raise ValueError(f"max_obs_chars must be >= 500, got {self.max_obs_chars!r}")


class AutoResearchEnv(OutcomeSeam, gym.Env):
    """Multi-turn AutoResearch env (see module docstring).

    Args:
        task: a fixed task (catalog id, task directory or :class:`Task`); ``None`` samples
            one per episode from ``tasks``.
        split: catalog split sampled when ``task`` and ``tasks`` are ``None``: ``"train"``
            or ``"test"``.
        tier: catalog tier sampled when ``task`` and ``tasks`` are ``None``: ``"small"``
            (default; the 2,500-row catalog) or ``"full"`` (full-size tables).
        tasks: explicit pool to sample from (ids, directories or :class:`Task` s), e.g.
            procedural tasks.
        config: :class:`AutoResearchConfig`; keyword overrides (``max_turns=3``) also work.
        executor: a :class:`wmrl_envs.sandbox.Executor`; default
            :func:`wmrl_envs.sandbox.default_executor`, created on first use.

    ``reset(options={"task": <id or dir>, "group_id": g, "group_size": n})`` fixes the task
    and group (``group_size`` is passed through to ``info`` for group-aware wrappers).

    Guards against silent slips:

    * an env sampling a catalog split refuses ``options["task"]`` from the other split (a
      ``split="train"`` env handing out a held-out task); ``options["any_split"] = True`` allows
      it with a warning;
    * a ``group_id`` without a ``task`` picks the task from the group id, not from each
      sub-env's own random stream, so every member of a GRPO group (one ``reset`` of a vector
      env) gets the same task instead of one random task each.
    """

    metadata = {"render_modes": ["ansi"]}

    def __init__(
        self,
        task: str | Task | None = None,
        *,
        split: str = "train",
        tier: str = "small",
        tasks: Sequence[str | Task] | None = None,
        config: AutoResearchConfig | None = None,
        executor: Any = None,
        render_mode: str | None = None,
        **overrides: Any,
    ):
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.config = config or AutoResearchConfig(**overrides)
        if config is not None and overrides:
            raise ValueError("pass either config= or keyword overrides, not both")
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        if tier not in TIERS:
            raise ValueError(f"tier must be one of {TIERS}, got {tier!r}")
        self.split = split
        self.tier = tier
        self.render_mode = render_mode
        self._fixed = get_task(task) if task is not None else None
        # Only an env that samples a catalog split has a split to respect; an explicit task or
        # pool is the user's own choice.
        self._samples_split = task is None and tasks is None
        if self._fixed is None:
            pool = (
                [get_task(t) for t in tasks]
                if tasks is not None
                else [get_task(t) for t in list_catalog(split, tier=tier)]
            )
            if not pool:
                raise ValueError(f"no tasks to sample from (split={split!r}, tier={tier!r}, tasks={tasks!r})")
            self._pool = pool
        else:
            self._pool = [self._fixed]
        self._executor = executor
        self._boards: dict[str, list[float] | None] = {}
        self.observation_space = FreeText(self.config.max_obs_chars)
        self.action_space = FreeText(self.config.max_action_chars)
        self.task: Task | None = None
        self.group_id: Any = None
        self._group_size: int | None = None
        self._turn = 0
        self._history: list[str] = []
        self._outcomes: list[Outcome | None] = []
        self._best: float | None = None
        self._last_obs = ""

    # ---------------------------------------------------------------------------- gym API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        options = dict(options or {})
        unknown = set(options) - {"task", "group_id", "group_size", "any_split"}
        if unknown:
            raise ValueError(
                f"unknown reset options {sorted(unknown)}; supported: 'task', 'group_id', 'group_size', 'any_split'"
            )
        if options.get("task") is not None:
            self.task = self._checked_split(get_task(options["task"]), bool(options.get("any_split")))
        elif options.get("group_id") is not None:
            # Same group id -> same task in every sub-env (crc32 is stable across processes).
            self.task = self._pool[zlib.crc32(str(options["group_id"]).encode()) % len(self._pool)]
        else:
            self.task = self._pool[int(self.np_random.integers(len(self._pool)))]
        self.group_id = options.get("group_id")
        self._group_size = options.get("group_size")
        self._turn, self._history, self._outcomes, self._best = 0, [], [], None
        self._last_obs = self._cap(self.task.overview(self.config.overview_chars) + "\n" + self._instructions())
        return self._last_obs, self._reset_info()

    def render(self) -> str | None:
        return self._last_obs if self.render_mode == "ansi" else None

    # ----------------------------------------------------------------------- outcome seam
    def grading_request(self, action: Any) -> GradingRequest | None:
        if self.task is None or self._turn >= self.config.max_turns:
            return None  # no episode in progress: nothing to grade (step() will say why)
        parsed = parse_action(action, self.config.max_action_chars)
        if parsed.kind != "execute" or check_syntax(parsed.payload) is not None:
            return None
        return GradingRequest(
            context=grading_context(
                self.task,
                self._turn,
                self._history,
                max_overview_chars=self.config.overview_chars,
                limits=self.run_limits(self.task),
            ),
            action=parsed.payload,
            group_id=self.group_id,
        )

    def grade(self, request: GradingRequest) -> Outcome | None:
        task = self._task_for(request.context["task_id"])
        from wmrl_envs.sandbox import Limits

        lim = self.run_limits(task)
        limits = Limits(
            wall_seconds=lim["wall_seconds"], cpu_seconds=lim["wall_seconds"], memory_bytes=lim["memory_bytes"]
        )
        return grade_script(task, request.action, self.executor, self._leaderboard(task), limits=limits)

    def run_limits(self, task: Task | None = None) -> dict[str, Any]:
        """Limits of one solution run of ``task`` (default: the current task):
        ``{"wall_seconds", "memory_bytes"}`` -- the config's where set, else the task's own."""
        task = task if task is not None else self.task
        if task is None:
            raise RuntimeError("no task: pass one or call reset() first")
        lim = task.run_limits()
        if self.config.wall_seconds is not None:
            lim["wall_seconds"] = float(self.config.wall_seconds)
        if self.config.memory_bytes is not None:
            lim["memory_bytes"] = int(self.config.memory_bytes)
        return lim

    def apply(self, action: Any, outcome: Outcome | None) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self._require_episode()
        assert self.task is not None  # _require_episode raised otherwise
        parsed = parse_action(action, self.config.max_action_chars)
        graded = False
        if parsed.kind == "malformed":
            outcome = Outcome("malformed", 0.0, feedback=f"Malformed reply: {parsed.payload}.")
            text = outcome.feedback
        elif parsed.kind == "request_info":
            outcome = None
            text = self._info(parsed.payload)
        else:
            syntax = check_syntax(parsed.payload)
            graded = syntax is None
            outcome = syntax if syntax is not None else outcome
            text = (
                outcome.feedback if outcome is not None else "The outcome of this run is unknown (the grader failed)."
            )
        attempt = parsed.kind != "request_info"
        if attempt:
            self._outcomes.append(outcome)
        reward = 0.0
        if outcome is not None and outcome.score is not None:
            best = outcome.score if self._best is None else max(self._best, outcome.score)
            reward = best - (self._best or 0.0)
            self._best = best
        status = outcome.status if outcome is not None else ("info" if not attempt else "unknown")
        self._history.append(f"turn {self._turn}: {parsed.kind} -> {status}: {text[:300]}")
        turn = self._turn
        self._turn += 1
        terminated = self._turn >= self.config.max_turns
        left = self.config.max_turns - self._turn
        header = (
            f"[turn {turn + 1}/{self.config.max_turns}: {parsed.kind}"
            + (f", {outcome.status}" if outcome is not None else "")
            + "]"
        )
        footer = f"\n\n{left} turn(s) left." if left else "\n\nNo turns left."
        self._last_obs = self._cap(f"{header}\n{text}", footer)
        info = {
            "task_id": self.task.task_id,
            "group_id": self.group_id,
            "split": self.task.split,
            "turn": turn,
            "action_type": parsed.kind,
            "outcome": outcome,
            "graded": graded,
        }
        if terminated:
            info["trajectory_reward"] = self._best
            info["outcomes"] = list(self._outcomes)
        return self._last_obs, float(reward), terminated, False, info

    # ---------------------------------------------------------------------------- helpers
    def _checked_split(self, task: Task, any_split: bool) -> Task:
        """``task``, unless it comes from the other catalog split than the one this env samples."""
        if not self._samples_split or task.split is None or task.split == self.split:
            return task
        if not any_split:
            raise ValueError(
                f"task {task.task_id!r} is in the {task.split!r} split but this env samples split={self.split!r} "
                f"(its tasks: {', '.join(t.task_id for t in self._pool)}); make the env with split={task.split!r}, "
                "or pass options={'task': ..., 'any_split': True} to use it anyway"
            )
        warnings.warn(
            f"using {task.split}-split task {task.task_id!r} in a split={self.split!r} env (any_split=True)",
            stacklevel=3,
        )
        return task

    @property
    def executor(self) -> Any:
        if self._executor is None:
            from wmrl_envs.sandbox import default_executor

            self._executor = default_executor()
        return self._executor

    def _require_episode(self) -> None:
        if self.task is None:
            raise RuntimeError("call reset() before step()")
        if self._turn >= self.config.max_turns:
            raise RuntimeError(f"the episode is over ({self.config.max_turns} turns); call reset()")

    def _task_for(self, task_id: str) -> Task:
        if self.task is not None and self.task.task_id == task_id:
            return self.task
        for t in self._pool:
            if t.task_id == task_id:
                return t
        return get_task(task_id)

    def _leaderboard(self, task: Task) -> list[float] | None:
        if task.task_id not in self._boards:
            self._boards[task.task_id] = load_leaderboard(task)
        return self._boards[task.task_id]

    def _cap(self, text: str, footer: str = "") -> str:
        room = self.config.max_obs_chars - len(footer)
        if len(text) > room:
            text = text[: room - 20] + "\n...[truncated]"
        return text + footer

    def _instructions(self) -> str:
        topics = ", ".join(INFO_TOPICS)
        lim = self.run_limits()
        return (
            f"\n## How to reply ({self.config.max_turns} turns)\n"
            "- To run a solution: reply with exactly one ```python code block. It runs with the files above in "
            f"./data/ (read-only, no network, {lim['wall_seconds']:g} s budget, {lim['memory_bytes'] / 2**30:g} GiB memory) "
            "and must write ./submission.csv.\n"
            f"- To ask for information: reply with one line `REQUEST_INFO: <topic>`; topics: {topics}.\n"
            "- Anything else scores 0. Your score is the best of your runs: 0.1 for a crash or timeout, 0.2 for no "
            "valid submission, 0.5 + 0.5 x leaderboard percentile for a valid one.\n"
        )

    def _reset_info(self) -> dict[str, Any]:
        t = self.task
        assert t is not None  # called after reset() chose a task
        return known_info(
            {
                "task_id": t.task_id,
                "group_id": self.group_id,
                "group_size": self._group_size,
                "split": t.split,
                "tier": t.tier,
                **self.run_limits(t),  # wall_seconds, memory_bytes
                "title": t.title,
                "target": t.target,
                "id_column": t.id_column,
                "submission_columns": t.submission_columns,
                "classes": list(t.classes) if t.classes is not None else None,
                "max_turns": self.config.max_turns,
                **t.meta_features(),
            }
        )  # unknown / not-applicable values (n_classes of a regression task) are left out

    def _info(self, topic: str) -> str:
        t = self.task
        assert t is not None  # only reached from apply(), inside an episode
        topic = topic.strip().lower()
        if topic == "overview":
            return t.overview(self.config.overview_chars)
        if topic == "help" or topic not in INFO_TOPICS:
            lead = "" if topic == "help" else f"Unknown topic {topic!r}. "
            return lead + "Topics: " + "; ".join(f"{k} ({v})" for k, v in INFO_TOPICS.items()) + self._instructions()
        if topic == "data_head":
            return "train.csv, first 5 rows:\n" + t.read_train().head(5).to_string(max_cols=30, max_colwidth=30)
        if topic == "column_stats":
            return "train.csv summary:\n" + t.read_train().describe(include="all").T.to_string(max_colwidth=30)
        if topic == "target_distribution":
            y = t.read_train()[t.target]
            if t.classes is not None:
                return f"class counts of {t.target!r} in train.csv:\n" + y.astype(str).value_counts().to_string()
            return (
                f"quantiles of {t.target!r} in train.csv:\n" + y.quantile([0, 0.1, 0.25, 0.5, 0.75, 0.9, 1]).to_string()
            )
        if topic == "metric":
            m = get_metric(t.metric)
            return (
                f"metric: {m.name} -- {m.description}; {'higher' if m.higher_is_better else 'lower'} is better.\n"
                f"submission.csv columns: {t.submission_columns} ({t.submission_format})."
            )
        if topic == "sample_submission":
            return (
                (t.public_dir / "sample_submission.csv").read_text().splitlines()[0]
                + "\n"
                + "\n".join((t.public_dir / "sample_submission.csv").read_text().splitlines()[1:6])
            )
        board = self._leaderboard(t)
        if not board:
            return "This task has no leaderboard yet."
        q = np.quantile(board, [0, 0.25, 0.5, 0.75, 1])
        return (
            f"leaderboard of {len(board)} reference solutions, {t.metric} "
            f"({'higher' if get_metric(t.metric).higher_is_better else 'lower'} is better): "
            f"min {q[0]:.5g}, 25% {q[1]:.5g}, median {q[2]:.5g}, 75% {q[3]:.5g}, max {q[4]:.5g}"
        )
