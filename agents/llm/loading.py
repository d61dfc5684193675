"""Loading what an LLM training run needs, in one place: policies, their warm start, world models.

Used by the agent's CLI (``python -m agents.llm``) and by every benchmark.

* :func:`load_policy` — ``"default"`` (SmolLM2-135M-Instruct, offline), ``"tiny"`` (a random
  from-config model), ``"tiny-plan"`` (tiny, warm-started on demonstration plans), or any
  Hugging Face name / local path; optionally with a trainer checkpoint's weights.
* :func:`lora_by_default` — whether a policy trains a LoRA adapter when nobody said
  (SmolLM2: yes; the tiny models: no).
* :func:`load_policy_weights` — a checkpoint's ``policy.pt`` into a policy, refused with one
  line when it was saved from another policy (other model, LoRA or not).
* :func:`warm_start_plans` — the supervised warm start: demonstration plans
  (:data:`WARM_START_REPLIES`, or :func:`rich_plan_replies` on the rich scaffold), or for the
  raw-code scaffold the agent corpus's valid scripts (:func:`corpus_script_replies`) on their
  own tasks' prompts (:func:`first_observations`).
* :func:`load_world_model` — ``"default"`` (the shipped :class:`CodeOutcomeModel`) or a
  saved model directory.

Constants: :data:`POLICIES`, :data:`WARM_START_REPLIES`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "POLICIES",
    "WARM_START_REPLIES",
    "rich_plan_replies",
    "corpus_script_replies",
    "first_observations",
    "load_policy",
    "load_policy_weights",
    "lora_by_default",
    "warm_start_plans",
    "load_world_model",
]

#: Named policies of :func:`load_policy` (anything else is a model name or path).
POLICIES = ("default", "tiny", "tiny-plan")

#: Demonstration plans of the warm start (the text after the plan scaffold's ``model:``
#: prefix): every model family, good and weak, so RL has choices to learn from.
WARM_START_REPLIES = (
    " random_forest\nn_estimators: 100\nmax_depth: 8",
    " gradient_boosting\nn_estimators: 100\nlearning_rate: 0.1",
    " extra_trees\nn_estimators: 100",
    " linear\nC: 1.0\nscale: yes",
    " knn\nn_neighbors: 15",
    " baseline",
)


def warm_start_plans(
    policy: Any,
    tasks: Sequence[str] | None = None,
    *,
    steps: int = 30,
    learning_rate: float = 1e-2,
    seed: int = 0,
    scaffold: Any = None,
    batch_size: int | None = None,
    checkpoint: str | Path | None = None,
    progress: bool = False,
) -> list[float]:
    """Supervised warm start (:func:`agents.llm.warm_start.warm_start`, which continues from
    ``checkpoint`` when the file exists) over ``tasks`` (default: the catalog's train split).
    Returns the loss per step.

    * plan scaffold (default): :data:`WARM_START_REPLIES`, so a randomly initialised model
      writes plan-like text (valid, failing and malformed plans after sampling noise);
    * rich plan scaffold: :func:`rich_plan_replies`, drawn over the whole grammar;
    * raw-code scaffold: the valid agent-style scripts of the shipped corpus on the train
      split's tables (:func:`corpus_script_replies`; never a held-out table), each on its own
      table's prompt with the env's first observation, so a pretrained model learns to answer
      with one complete script. ``tasks`` does not restrict these: the corpus covers other
      tables than a tier's train split, and a script only fits the table it was written for.
    """
    from agents.llm.scaffolds import PlanScaffold, TaskSpec
    from agents.llm.warm_start import warm_start
    from wmrl_envs.autoresearch.tasks import list_catalog

    scaffold = scaffold or PlanScaffold()
    name = getattr(scaffold, "name", "")
    replies: Sequence[str | tuple[str, str]]
    observations = None
    if name == "raw":
        replies = corpus_script_replies()
        task_ids = sorted({t for t, _ in replies})
        observations = first_observations(task_ids)
    else:
        task_ids = list(tasks or list_catalog("train"))
        replies = rich_plan_replies(task_ids, seed=seed) if name == "rich" else WARM_START_REPLIES
    specs = [TaskSpec.from_task(t) for t in task_ids]
    return warm_start(
        policy,
        scaffold,
        specs,
        replies,
        steps=steps,
        learning_rate=learning_rate,
        seed=seed,
        observations=observations,
        batch_size=batch_size,
        micro_batch_size=1 if name == "raw" else None,  # scripts of unequal length: no padding
        checkpoint=checkpoint,
        progress=progress,
    )


def corpus_script_replies() -> list[tuple[str, str]]:
    """``(task_id, reply)`` demonstrations for the raw-code scaffold: the shipped agent
    corpus's agent-style scripts on train-split tables that ran and wrote a valid submission,
    each as a fenced ```python block. Held-out tables and families and the exploit suite are
    never included, so a policy warm-started on them is evaluated out of sample."""
    from agents.llm.scaffolds import fenced_script
    from wmrl_envs.world_models.agent_corpus import read_agent_corpus

    records = [r for r in read_agent_corpus(splits=("train",)) if r.outcome is not None and r.outcome.status == "valid"]
    if not records:
        raise FileNotFoundError("the agent corpus holds no valid train-split script to warm-start on")
    return [(r.task_id, fenced_script(r.code)) for r in records]


def first_observations(tasks: Sequence[str]) -> dict[str, str]:
    """The AutoResearch env's first observation (task overview and instructions) per task id,
    as an episode's prompt shows it."""
    import gymnasium as gym

    import wmrl_envs  # noqa: F401  (registers the env ids)

    env = gym.make("wmrl/AutoResearch-v0", split="train", max_turns=1)
    try:
        return {t: str(env.reset(options={"task": t, "any_split": True})[0]) for t in tasks}
    finally:
        env.close()


def rich_plan_replies(tasks: Sequence[str], n: int = 48, seed: int = 0) -> list[str]:
    """``n`` demonstrations for the rich plan scaffold, drawn at random from the whole plan
    grammar (:func:`~wmrl_envs.autoresearch.plans.sample_plan`, no mistakes) over ``tasks``, so
    a warm-started policy spreads over the space instead of collapsing to a few scripts.
    Each is the text after the scaffold's ``"family:"`` prefix."""
    import random

    from wmrl_envs.autoresearch.plans import plan_to_text, sample_plan
    from wmrl_envs.autoresearch.tasks import get_task

    rng = random.Random(seed)
    loaded = [get_task(t) for t in tasks]
    return [
        plan_to_text(sample_plan(rng, rng.choice(loaded), mistake_rate=0.0)).removeprefix("family:") for _ in range(n)
    ]


def lora_by_default(spec: str) -> bool:
    """Train a LoRA adapter for ``spec`` unless told otherwise? Yes for the default
    SmolLM2-135M, no for the tiny from-config models and for other models.

    What LoRA buys for SmolLM2 here (``python -m benchmarks.llm_step_components``, 4 samples,
    2 busy cores): 4.9 M trainable parameters instead of 134.5 M, so optimizer state and
    checkpoints are ~27x smaller, a vLLM weight sync is a small adapter file instead of all
    weights, and the KL reference needs no model copy; peak RSS 2.69 GB vs 3.03 GB. It does
    *not* make the update cheaper in CPU time on CPU (45 vs 42 CPU-s): the backward pass
    through every layer remains.

    >>> lora_by_default("default"), lora_by_default("tiny-plan")
    (True, False)
    """
    return spec == "default"


def load_policy(
    spec: str = "default", *, checkpoint: str | Path | None = None, lora: bool | None = False, seed: int = 0
) -> Any:
    """An :class:`~agents.llm.policy.LLMPolicy`.

    Args:
        spec: one of :data:`POLICIES`, or a Hugging Face model name / local path.
        checkpoint: a trainer checkpoint directory (or a directory holding ``policy.pt``, or
            a run directory holding ``checkpoint/``) whose trainable weights are loaded.
        lora: train a LoRA adapter instead of all weights (``None``: :func:`lora_by_default`).
        seed: initialisation seed of the tiny models.

    Raises:
        FileNotFoundError: ``checkpoint`` holds no ``policy.pt`` (nor ``checkpoint/policy.pt``).
        ValueError: the checkpoint was saved from another policy (:func:`load_policy_weights`).
    """
    from agents.llm.policy import LLMPolicy, LoraSettings

    if lora is None:
        lora = lora_by_default(spec)
    settings = LoraSettings() if lora else None
    file = Path(checkpoint) / "policy.pt" if checkpoint is not None else None
    if file is not None and not file.is_file() and (file.parent / "checkpoint" / "policy.pt").is_file():
        file = file.parent / "checkpoint" / "policy.pt"  # a run directory (train --output-dir)
    if file is not None and not file.is_file():  # before the (slow) model load
        raise FileNotFoundError(f"{checkpoint} is not a trainer checkpoint ({file.name} missing)")
    if spec == "default":
        policy = LLMPolicy.default(lora=settings)
    elif spec in ("tiny", "tiny-plan"):
        policy = LLMPolicy.tiny(lora=settings, seed=seed)
        if spec == "tiny-plan":
            warm_start_plans(policy, seed=seed)
    else:
        policy = LLMPolicy.from_pretrained(spec, lora=settings)
    if file is not None:
        load_policy_weights(policy, file)
        policy.sync_backend()
    return policy


def load_policy_weights(policy: Any, file: str | Path) -> None:
    """Load a checkpoint's trainable weights (``policy.pt``) into ``policy``.

    Raises:
        ValueError: the file holds another policy's weights (tensor names or shapes differ:
            another model, or LoRA vs full fine-tuning), in one line that says so.
    """
    import torch

    state = torch.load(file, weights_only=True)
    expected = {n: tuple(p.shape) for n, p in policy.model.named_parameters() if p.requires_grad}
    missing = [n for n in expected if n not in state]
    wrong = [n for n in expected if n in state and tuple(state[n].shape) != expected[n]]
    if missing or wrong:

        def kind(names: Any) -> str:
            return "LoRA adapter" if any("lora_" in n for n in names) else "full model"

        detail = f"{len(missing)} of its tensors missing" if missing else f"tensor {wrong[0]!r} has another shape"
        raise ValueError(
            f"{file} holds another policy's weights ({kind(state)}, {len(state)} tensors; this policy is a "
            f"{kind(expected)} with {len(expected)} trainable tensors, {detail}): load it with the --policy and "
            "--lora it was trained with"
        )
    policy.load_trainable_state_dict(state)


def load_world_model(spec: str = "default") -> Any:
    """``"default"`` = the shipped fitted :class:`~wmrl_envs.world_models.CodeOutcomeModel`;
    anything else = a directory written by ``CodeOutcomeModel.save`` / ``wmrl-wm fit``."""
    from wmrl_envs.world_models import CodeOutcomeModel

    if spec != "default":
        return CodeOutcomeModel.load(spec)
    try:
        return CodeOutcomeModel.load_default()
    except FileNotFoundError as err:
        raise FileNotFoundError(
            f"{err}. Fit one with `wmrl-wm fit --logs <pool logs> --split train --out <dir>` and pass its directory"
        ) from err
