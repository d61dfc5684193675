"""TRL's ``GRPOTrainer`` against a ``wmrl-serve`` stack: environment mode, one group = one anchor group.

TRL (>= 1.16) trains against environments through ``GRPOTrainer(environment_factory=...)``: one
environment instance per rollout, its ``reset(**row)`` text appended to the prompt, its public
methods offered to the model as tools. This adapter's environment, :class:`WMRLToolEnv`, is a
``wmrl/Remote-v0`` session on a ``wmrl-serve`` server (``real`` | ``wm`` | ``wmrl`` stack) with
one tool, :meth:`WMRLToolEnv.submit`; :func:`stack_reward` is the reward function: it reads the
stack's own trajectory reward (world-model graded, calibrated, or real on anchor groups).

How TRL's groups become the stack's GRPO groups, exactly as in the project's own trainer:

* TRL resets a generation batch's instances in batch order, ``num_generations`` consecutive
  rollouts per prompt. The factory's :class:`GroupCoordinator` counts those resets, so rollout
  ``k`` of batch ``b`` joins group ``"<run>-b<b>-g<k // num_generations>"`` with
  ``group_size = num_generations`` (and checks that a group's members share their row);
* at a batch's first reset it announces the batch's groups to the server (``begin_step``: the
  anchor decisions for the whole step, with the per-step floor, and the calibration's step
  boundary), as ``agents.grpo`` does each step;
* members of an anchor group are graded for real as well; their pairs reach the server's one
  calibrator, whoever's rollout they were.

A rollout whose model never called ``submit`` is graded on its final text through the scaffold
(``raw``: the fenced script in it; ``plan``: the plan rendered into a script), as the project's
trainer grades a reply; an unknown reward is ``None`` (TRL leaves such a rollout out of its
group's baseline), never 0.

>>> from agents.trl_adapter import environment_factory, stack_reward  # doctest: +SKIP
>>> trainer = GRPOTrainer(model, reward_funcs=stack_reward, args=args, train_dataset=task_dataset(["titanic"]),
...                       environment_factory=environment_factory("http://127.0.0.1:8000", args))  # doctest: +SKIP

Classes: :class:`WMRLToolEnv`, :class:`GroupCoordinator`. Functions: :func:`environment_factory`,
:func:`stack_reward`, :func:`task_dataset`, :func:`tool_ready_tokenizer`.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agents.llm.scaffolds import TaskSpec, make_scaffold
from wmrl_envs.remote import RemoteEnv

__all__ = [
    "WMRLToolEnv",
    "GroupCoordinator",
    "environment_factory",
    "stack_reward",
    "task_dataset",
    "prompt_text",
    "tool_ready_tokenizer",
]


class GroupCoordinator:
    """Turns TRL's sequential resets into GRPO group ids (see the module docstring).

    Args:
        group_size: TRL's ``num_generations``.
        groups_per_step: prompts per generation batch (``generation_batch_size // num_generations``).
        run: a prefix making this run's ids unique on a shared server (default: random).

    >>> c = GroupCoordinator(group_size=2, groups_per_step=2, run="r")
    >>> [c.next("a")[0] for _ in range(2)] + [c.next("b")[0] for _ in range(2)]
    ['r-b0-g0', 'r-b0-g0', 'r-b0-g1', 'r-b0-g1']
    >>> c.next("a")
    ('r-b1-g0', ['r-b1-g0', 'r-b1-g1'])
    """

    def __init__(self, group_size: int, groups_per_step: int, run: str | None = None) -> None:
        if group_size < 1 or groups_per_step < 1:
            raise ValueError(f"group_size and groups_per_step must be >= 1, got {group_size}, {groups_per_step}")
        self.group_size = group_size
        self.groups_per_step = groups_per_step
        self.run = run or uuid.uuid4().hex[:8]
        self._resets = 0
        self._keys: dict[str, Any] = {}
        self._lock = threading.Lock()

    def next(self, key: Any) -> tuple[str, list[str] | None]:
        """The group of the next reset (of a rollout on row ``key``), and the batch's group ids
        when this reset opens a batch (``None`` otherwise)."""
        with self._lock:
            n = self._resets
            self._resets += 1
        per_batch = self.group_size * self.groups_per_step
        batch, position = divmod(n, per_batch)
        gid = f"{self.run}-b{batch}-g{position // self.group_size}"
        if self._keys.setdefault(gid, key) != key:
            raise RuntimeError(
                f"rollouts of group {gid} are on different rows ({self._keys[gid]!r}, {key!r}): TRL's batch layout "
                "is not num_generations consecutive rollouts per prompt; check group_size / groups_per_step"
            )
        batch_ids = None
        if position == 0:
            batch_ids = [f"{self.run}-b{batch}-g{j}" for j in range(self.groups_per_step)]
            self._keys = {gid: key}  # earlier batches' groups are complete
        return gid, batch_ids


class WMRLToolEnv:
    """One TRL rollout's environment: a session on a ``wmrl-serve`` server.

    TRL offers every public method but ``reset`` as a tool: this class has exactly one,
    :meth:`submit`. Made by :func:`environment_factory`; the attributes ``history`` (the
    ``info`` of each step of the current episode) and ``reward`` (its trajectory reward,
    ``None`` while unknown) are for inspection.
    """

    def __init__(self, url: str, coordinator: GroupCoordinator, scaffold: str = "raw") -> None:
        self._env = RemoteEnv(url)
        self._coordinator = coordinator
        self._scaffold = make_scaffold(scaffold)
        self._spec: TaskSpec | None = None
        self.history: list[dict[str, Any]] = []
        self.reward: float | None = None
        self.done = True

    def reset(self, **row: Any) -> str:
        """Start this rollout's episode on the row's task; returns the task text for the prompt."""
        key = row.get("row", row.get("task"))
        group_id, batch = self._coordinator.next(key)
        if batch is not None:
            self._env.begin_step(batch)
        options: dict[str, Any] = {"group_id": group_id, "group_size": self._coordinator.group_size}
        if row.get("task") is not None:
            options["task"] = row["task"]
        obs, info = self._env.reset(options=options)
        self._spec = TaskSpec.from_info(info)
        self.history, self.reward, self.done = [info], None, False
        return prompt_text(self._scaffold, str(obs), self._spec)

    def submit(self, script: str) -> str:
        """Run a complete Python solution script for the task and get its outcome.

        Args:
            script: the whole script: it reads the task's files and writes the submission file.

        Returns:
            The outcome: the status and score of the run, or why it failed.
        """
        if self.done:
            return "The episode has ended: no more submissions are graded."
        code = script if script.lstrip().startswith("```") else f"```python\n{script}\n```"
        return self._step(code)

    def _step(self, action: str) -> str:
        obs, _, terminated, truncated, info = self._env.step(action)
        self.history.append(info)
        if terminated or truncated:
            self.done = True
            self.reward = info.get("trajectory_reward")  # absent = unknown
        return str(obs)

    def _finish(self, text: str) -> float | None:
        """The rollout's reward: an episode the model never submitted in is graded on its final
        text through the scaffold; an episode still running keeps its best known score so far."""
        if not self.done and len(self.history) == 1:
            assert self._spec is not None  # set by reset
            prefix = getattr(self._scaffold, "response_prefix", "")
            reply = text if not prefix or text.lstrip().startswith(prefix) else prefix + text
            self._step(self._scaffold.to_action(reply, self._spec))
        if self.done:
            return self.reward
        scores = [i["outcome"].score for i in self.history if i.get("graded") and i.get("outcome") is not None]
        known = [s for s in scores if s is not None]
        return max(known) if known else None

    def __del__(self) -> None:
        self._env.close()


def environment_factory(url: str, args: Any = None, *, scaffold: str = "raw", **sizes: int) -> Callable[[], Any]:
    """The ``environment_factory`` for ``GRPOTrainer``: instances share one :class:`GroupCoordinator`.

    Args:
        url: the ``wmrl-serve`` server.
        args: the trainer's ``GRPOConfig`` (its ``num_generations`` and ``generation_batch_size``
            give the group layout); or pass ``group_size=`` and ``groups_per_step=``.
        scaffold: how a final text becomes an action (``raw`` | ``plan`` | ``rich``).
    """
    if args is not None:
        sizes.setdefault("group_size", int(args.num_generations))
        sizes.setdefault("groups_per_step", int(args.generation_batch_size) // int(args.num_generations))
    coordinator = GroupCoordinator(sizes["group_size"], sizes["groups_per_step"])
    RemoteEnv(url).close()  # fail fast on a wrong url, before TRL builds anything

    def factory() -> WMRLToolEnv:
        return WMRLToolEnv(url, coordinator, scaffold)

    return factory


def prompt_text(scaffold: Any, obs: str, spec: TaskSpec) -> str:
    """What :meth:`WMRLToolEnv.reset` adds to the prompt: the scaffold's opening messages (as
    the project's trainer opens an episode), joined into one user text."""
    if isinstance(scaffold, str):
        scaffold = make_scaffold(scaffold)
    return "\n\n".join(m["content"] for m in scaffold.initial_messages(obs, spec))


def _final_text(completion: Any) -> str:
    if isinstance(completion, str):
        return completion
    replies = [m.get("content") or "" for m in completion if isinstance(m, Mapping) and m.get("role") == "assistant"]
    return replies[-1] if replies else ""


def stack_reward(completions: Sequence[Any], environments: Sequence[Any] | None = None, **_: Any) -> list:
    """TRL reward function: each rollout's trajectory reward as the server's stack graded it
    (``None`` when unknown: TRL excludes it, never scores it 0)."""
    if environments is None:
        raise ValueError("stack_reward needs GRPOTrainer(environment_factory=...) (it reads the environments)")
    return [env._finish(_final_text(c)) for env, c in zip(environments, completions)]


def task_dataset(tasks: Sequence[str], repeats: int = 1) -> Any:
    """A ``datasets.Dataset`` of one row per (task, repeat): ``prompt`` (an empty user turn the
    environment's ``reset`` text completes), ``task`` and a unique ``row``."""
    from datasets import Dataset

    names = list(tasks) * repeats
    rows = [{"prompt": [{"role": "user", "content": ""}], "task": t, "row": i} for i, t in enumerate(names)]
    return Dataset.from_list(rows)


def tool_ready_tokenizer(tokenizer: Any) -> Any:
    """``tokenizer`` with a chat template TRL can run tools with: kept if TRL accepts it, else
    TRL's ChatML (Qwen2.5) template, for ChatML tokenizers such as SmolLM2's."""
    from trl.chat_template_utils import add_response_schema, qwen2_5_chat_template, supports_tool_calling

    if getattr(tokenizer, "response_template", None) or getattr(tokenizer, "response_schema", None):
        return tokenizer
    try:  # a template TRL knows how to parse tool calls from
        if supports_tool_calling(tokenizer):
            return add_response_schema(tokenizer)
    except ValueError:
        pass
    tokenizer.chat_template = qwen2_5_chat_template
    return add_response_schema(tokenizer)
