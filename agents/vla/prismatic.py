"""Load a full-size Prismatic / MiniVLA run directory into :class:`~agents.vla.model.MiniVLA`.

A Prismatic VLA run directory (OpenVLA, MiniVLA) holds::

    config.json                      the run config (vision_backbone_id, llm_backbone_id, ...)
    dataset_statistics.json          {dataset: {"action": {"q01", "q99", "mask", ...}, ...}}
    checkpoints/latest-checkpoint.pt torch.save({"model": {"vision_backbone": {...},
                                     "projector": {...}, "llm_backbone": {...}}})

The vision backbone's weights are *timm* ViTs (``dino_featurizer.*`` / ``siglip_featurizer.*``
for fused ``dinosiglip`` backbones, ``featurizer.*`` for a single SigLIP); this module converts
them to ``transformers``' ``SiglipVisionModel`` / ``Dinov2WithRegistersModel`` keys (fused
``qkv`` split into q / k / v, DINOv2's class-free position table given a zero row for the
CLS token, layer-scale ``gamma`` to ``lambda1``), the projector keys map one to one, and the
LLM keys lose their ``llm.`` prefix. Shapes (widths, depths, patch and image size, vocabulary)
are read from the checkpoint; attention-head counts, which shapes do not determine, come from
:data:`HEADS_BY_WIDTH` unless given.

Functions: :func:`load_prismatic`, :func:`convert_state_dict`, :func:`infer_config`,
:func:`write_synthetic_run`. Constants: :data:`OPENVLA_PROMPT`, :data:`HEADS_BY_WIDTH`.

The conversion round trip on a tiny synthetic run (the format a user's run directory has):

>>> import tempfile, torch
>>> from agents.vla.model import WordHashTokenizer
>>> run = write_synthetic_run(tempfile.mkdtemp(), seed=0)
>>> model = load_prismatic(run, tokenizer=WordHashTokenizer(64))
>>> model.config.dino is not None, model.config.image_size
(True, 28)
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from agents.vla.model import MiniVLA, MiniVLAConfig

__all__ = [
    "load_prismatic",
    "convert_state_dict",
    "infer_config",
    "write_synthetic_run",
    "find_checkpoint",
    "OPENVLA_PROMPT",
    "HEADS_BY_WIDTH",
]

#: OpenVLA's prompt (the Prismatic "pure" prompt builder); MiniVLA's Qwen builder wraps it alike.
OPENVLA_PROMPT = "In: What action should the robot take to {instruction}?\nOut:"
#: Attention heads by model width for the backbones Prismatic / MiniVLA use (SigLIP-So400m
#: 1152 -> 16, ViT-B 768 -> 12, DINOv2-L 1024 -> 16, Qwen2.5-0.5B 896 -> 14).
HEADS_BY_WIDTH = {32: 2, 48: 2, 1152: 16, 768: 12, 1024: 16, 896: 14, 1536: 12, 2048: 16, 3584: 28, 4096: 32}

_BLOCK = re.compile(r"blocks\.(\d+)\.(.+)")


def find_checkpoint(run_dir: str | Path) -> Path:
    """``checkpoints/latest-checkpoint.pt``, else the last ``checkpoints/*.pt`` by name."""
    ckpts = Path(run_dir) / "checkpoints"
    latest = ckpts / "latest-checkpoint.pt"
    if latest.is_file():
        return latest
    found = sorted(ckpts.glob("*.pt"))
    if not found:
        raise FileNotFoundError(f"no checkpoint in {ckpts} (expected latest-checkpoint.pt or step-*.pt)")
    return found[-1]


def _split_qkv(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k, v = t.chunk(3, dim=0)
    return q, k, v


def _convert_siglip(sd: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    pre = ""
    for key, t in sd.items():
        if key.startswith("attn_pool.") or key.startswith("head"):
            continue  # the MAP head: Prismatic reads patch features, never the pooled output
        if key == "patch_embed.proj.weight":
            out[pre + "embeddings.patch_embedding.weight"] = t
        elif key == "patch_embed.proj.bias":
            out[pre + "embeddings.patch_embedding.bias"] = t
        elif key == "pos_embed":
            out[pre + "embeddings.position_embedding.weight"] = t.reshape(-1, t.shape[-1])
        elif key.startswith("norm."):
            out[pre + "post_layernorm." + key[5:]] = t
        elif m := _BLOCK.fullmatch(key):
            i, rest = m.group(1), m.group(2)
            layer = f"{pre}encoder.layers.{i}."
            kind = rest.rsplit(".", 1)[-1]
            if rest.startswith("attn.qkv."):
                for name, part in zip(("q_proj", "k_proj", "v_proj"), _split_qkv(t)):
                    out[f"{layer}self_attn.{name}.{kind}"] = part
            else:
                mapped = {"norm1": "layer_norm1", "norm2": "layer_norm2", "attn.proj": "self_attn.out_proj"}
                head = rest.rsplit(".", 1)[0]
                out[layer + mapped.get(head, head) + "." + kind] = t
        else:
            raise KeyError(f"unexpected SigLIP (timm) key {key!r}")
    return out


def _convert_dino(sd: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for key, t in sd.items():
        if key.startswith("head"):
            continue
        if key == "cls_token":
            out["embeddings.cls_token"] = t
        elif key == "reg_token":
            out["embeddings.register_tokens"] = t
        elif key == "pos_embed":
            # timm's DINOv2-reg tables have no CLS row (no_embed_class); HF adds the table to
            # [CLS, patches], so a zero CLS row reproduces timm exactly.
            out["embeddings.position_embeddings"] = torch.cat(
                [t.new_zeros(1, 1, t.shape[-1]), t.reshape(1, -1, t.shape[-1])], 1
            )
        elif key.startswith("patch_embed.proj."):
            out["embeddings.patch_embeddings.projection." + key.rsplit(".", 1)[-1]] = t
        elif key.startswith("norm."):
            out["layernorm." + key[5:]] = t
        elif m := _BLOCK.fullmatch(key):
            i, rest = m.group(1), m.group(2)
            layer = f"encoder.layer.{i}."
            kind = rest.rsplit(".", 1)[-1]
            if rest.startswith("attn.qkv."):
                for name, part in zip(("q_proj", "k_proj", "v_proj"), _split_qkv(t)):
                    out[f"{layer}attention.{name}.{kind}"] = part
            elif rest in ("ls1.gamma", "ls2.gamma"):
                out[layer + ("layer_scale1" if rest.startswith("ls1") else "layer_scale2") + ".lambda1"] = t
            else:
                head = rest.rsplit(".", 1)[0]
                out[layer + {"attn.proj": "attention.o_proj"}.get(head, head) + "." + kind] = t
        else:
            raise KeyError(f"unexpected DINOv2 (timm) key {key!r}")
    return out


def _flatten(model_state: Mapping[str, Any]) -> dict[str, dict[str, torch.Tensor]]:
    """Per-module dicts (``vision_backbone``, ``projector``, ``llm_backbone``) from either the
    nested Prismatic layout or one flat dict with those prefixes."""
    if all(isinstance(v, Mapping) for v in model_state.values()):
        return {k: dict(v) for k, v in model_state.items()}
    out: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in model_state.items():
        module, _, rest = key.partition(".")
        out.setdefault(module, {})[rest] = t
    return out


def convert_state_dict(model_state: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """A Prismatic checkpoint's ``["model"]`` entry as a :class:`MiniVLA` state dict.

    Raises:
        KeyError: a module is missing (e.g. a vision backbone frozen during training is not
            saved by Prismatic) or a key has no known mapping.
    """
    modules = _flatten(model_state)
    missing = {"vision_backbone", "projector", "llm_backbone"} - set(modules)
    if missing:
        raise KeyError(
            f"checkpoint lacks {sorted(missing)}; Prismatic saves only trained modules, so a run with a frozen "
            "vision backbone needs its featurizer weights merged in under 'vision_backbone'"
        )
    out: dict[str, torch.Tensor] = {}
    vision = modules["vision_backbone"]
    groups: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in vision.items():
        prefix, _, rest = key.partition(".")
        groups.setdefault(prefix, {})[rest] = t
    for prefix, sd in groups.items():
        if prefix in ("siglip_featurizer", "featurizer"):
            out.update({f"siglip.{k}": v for k, v in _convert_siglip(sd).items()})
        elif prefix == "dino_featurizer":
            out.update({f"dino.{k}": v for k, v in _convert_dino(sd).items()})
        else:
            raise KeyError(
                f"unexpected vision backbone module {prefix!r} (expected siglip_featurizer / dino_featurizer / featurizer)"
            )
    for key, t in modules["projector"].items():
        out[key if key.startswith("projector.") else "projector." + key] = t
    for key, t in modules["llm_backbone"].items():  # Prismatic's LLMBackbone.llm is our MiniVLA.llm
        out[key if key.startswith("llm.") else "llm." + key] = t
    return out


def _count(sd: Mapping[str, Any], pattern: str) -> int:
    rx = re.compile(pattern)
    return len({m.group(1) for k in sd if (m := rx.match(k))})


def _vit_kwargs(sd: Mapping[str, torch.Tensor], heads: int | None) -> dict[str, Any]:
    w = sd["patch_embed.proj.weight"]
    width, patch = int(w.shape[0]), int(w.shape[-1])
    n_pos = sd["pos_embed"].reshape(-1, width).shape[0]
    side = int(round(n_pos**0.5))
    return {
        "hidden_size": width,
        "num_hidden_layers": _count(sd, r"blocks\.(\d+)\."),
        "num_attention_heads": heads or HEADS_BY_WIDTH.get(width, max(1, width // 64)),
        "patch_size": patch,
        "image_size": side * patch,
        "_mlp": int(sd["blocks.0.mlp.fc1.weight"].shape[0]),
    }


def infer_config(
    model_state: Mapping[str, Any],
    run_config: Mapping[str, Any] | None = None,
    *,
    vision_heads: int | None = None,
    llm_heads: int | None = None,
    llm_config: Mapping[str, Any] | None = None,
) -> MiniVLAConfig:
    """The :class:`MiniVLAConfig` of a Prismatic checkpoint, from its tensor shapes.

    ``llm_config`` (a Hugging Face ``Qwen2Config`` dict, e.g. the LLM's own ``config.json``)
    overrides what is inferred for the language model.
    """
    modules = _flatten(model_state)
    vision = modules["vision_backbone"]
    groups: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in vision.items():
        prefix, _, rest = key.partition(".")
        groups.setdefault(prefix, {})[rest] = t
    sig = groups.get("siglip_featurizer") or groups.get("featurizer")
    if sig is None:
        raise KeyError("no SigLIP featurizer in the checkpoint's vision backbone")
    siglip = _vit_kwargs(sig, vision_heads)
    siglip["intermediate_size"] = siglip.pop("_mlp")
    siglip["vision_use_head"] = False
    dino = None
    if "dino_featurizer" in groups:
        d = groups["dino_featurizer"]
        dino = _vit_kwargs(d, vision_heads)
        mlp_hidden = dino.pop("_mlp")
        if mlp_hidden % dino["hidden_size"]:
            raise ValueError(f"DINOv2 MLP width {mlp_hidden} is not a multiple of its width {dino['hidden_size']}")
        dino["mlp_ratio"] = mlp_hidden // dino["hidden_size"]
        dino["num_register_tokens"] = int(d["reg_token"].shape[1]) if "reg_token" in d else 0
    llm_sd = modules["llm_backbone"]
    emb = llm_sd["llm.model.embed_tokens.weight"]
    vocab, width = int(emb.shape[0]), int(emb.shape[1])
    heads = llm_heads or HEADS_BY_WIDTH.get(width, max(1, width // 64))
    head_dim = width // heads
    llm: dict[str, Any] = {
        "vocab_size": vocab,
        "hidden_size": width,
        "num_hidden_layers": _count(llm_sd, r"llm\.model\.layers\.(\d+)\."),
        "num_attention_heads": heads,
        "num_key_value_heads": int(llm_sd["llm.model.layers.0.self_attn.k_proj.weight"].shape[0]) // head_dim,
        "intermediate_size": int(llm_sd["llm.model.layers.0.mlp.gate_proj.weight"].shape[0]),
        "tie_word_embeddings": "llm.lm_head.weight" not in llm_sd,
        "rope_theta": 1_000_000.0,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 32768,
    }
    llm.update(dict(llm_config or {}))
    image_size = siglip["image_size"]
    return MiniVLAConfig(
        siglip=siglip,
        dino=dino,
        llm=llm,
        image_size=image_size,
        cameras=("agentview_image",),
        use_proprio=False,
        text_vocab_size=None,
        prompt=str((run_config or {}).get("prompt", OPENVLA_PROMPT)),
        gripper_mode="openvla",
    )


def load_prismatic(
    run_dir: str | Path,
    *,
    checkpoint: str | Path | None = None,
    dataset: str | None = None,
    tokenizer: Any = None,
    vision_heads: int | None = None,
    llm_heads: int | None = None,
    llm_config: Mapping[str, Any] | None = None,
    cameras: tuple[str, ...] = ("agentview_image",),
) -> MiniVLA:
    """A :class:`MiniVLA` with a Prismatic / MiniVLA run directory's weights and statistics.

    Args:
        run_dir: the run directory (``config.json``, ``dataset_statistics.json``, ``checkpoints/``).
        checkpoint: a specific ``.pt`` (default: :func:`find_checkpoint`).
        dataset: the ``dataset_statistics.json`` entry to unnormalise with (OpenVLA's
            ``unnorm_key``); default the only one.
        tokenizer: the instruction tokenizer; default ``AutoTokenizer.from_pretrained`` of
            ``run_dir/tokenizer`` (or ``run_dir`` itself when it holds tokenizer files).
        vision_heads / llm_heads / llm_config: see :func:`infer_config`.
        cameras: observation keys the checkpoint was trained on (OpenVLA / MiniVLA on LIBERO:
            the agent view only; wrist-camera variants add ``"wrist_image"``).

    Raises:
        FileNotFoundError: no checkpoint / statistics; ValueError: no tokenizer found.
    """
    run_dir = Path(run_dir)
    run_config = json.loads((run_dir / "config.json").read_text()) if (run_dir / "config.json").is_file() else {}
    stats_file = run_dir / "dataset_statistics.json"
    if not stats_file.is_file():
        raise FileNotFoundError(f"{stats_file} not found: a VLA run directory carries its action statistics")
    path = Path(checkpoint) if checkpoint else find_checkpoint(run_dir)
    blob = torch.load(path, map_location="cpu", weights_only=True)
    state = blob.get("model", blob)
    config = infer_config(state, run_config, vision_heads=vision_heads, llm_heads=llm_heads, llm_config=llm_config)
    config.cameras = tuple(cameras)
    if tokenizer is None:
        for candidate in (run_dir / "tokenizer", run_dir):
            if (candidate / "tokenizer_config.json").is_file() or (candidate / "tokenizer.json").is_file():
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(str(candidate))
                break
        else:
            raise ValueError(f"no tokenizer files in {run_dir}/tokenizer or {run_dir}: pass tokenizer=")
    stats = json.loads(stats_file.read_text())
    if dataset is None:
        if len(stats) != 1:
            raise ValueError(f"dataset_statistics.json holds {sorted(stats)}: pass dataset= (OpenVLA's unnorm_key)")
        dataset = next(iter(stats))
    model = MiniVLA(config, stats[dataset], text_tokenizer=tokenizer)
    result = model.load_state_dict(convert_state_dict(state), strict=False)
    allowed_missing = {"dino.embeddings.mask_token"}
    missing = [k for k in result.missing_keys if k not in allowed_missing and not k.startswith("proprio_proj")]
    if config.llm.get("tie_word_embeddings"):
        missing = [k for k in missing if k != "llm.lm_head.weight"]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"checkpoint does not match the inferred model: missing {missing[:8]}, unexpected {result.unexpected_keys[:8]}"
        )
    return model.eval()


def _timm_vit(
    prefix: str, width: int, depth: int, patch: int, side: int, mlp: int, *, dino: bool, registers: int = 4
) -> dict[str, torch.Tensor]:
    sd: dict[str, torch.Tensor] = {
        "patch_embed.proj.weight": torch.randn(width, 3, patch, patch) * 0.05,
        "patch_embed.proj.bias": torch.randn(width) * 0.02,
        "pos_embed": torch.randn(1, side * side, width) * 0.02,
        "norm.weight": 1 + 0.1 * torch.randn(width),
        "norm.bias": 0.02 * torch.randn(width),
    }
    if dino:
        sd["cls_token"] = torch.randn(1, 1, width) * 0.02
        sd["reg_token"] = torch.randn(1, registers, width) * 0.02
    else:
        sd.update({"attn_pool.latent": torch.randn(1, 1, width), "attn_pool.q.weight": torch.randn(width, width)})
    for i in range(depth):
        b = f"blocks.{i}."
        sd.update(
            {
                b + "norm1.weight": 1 + 0.1 * torch.randn(width),
                b + "norm1.bias": 0.02 * torch.randn(width),
                b + "attn.qkv.weight": torch.randn(3 * width, width) * width**-0.5,
                b + "attn.qkv.bias": 0.02 * torch.randn(3 * width),
                b + "attn.proj.weight": torch.randn(width, width) * width**-0.5,
                b + "attn.proj.bias": 0.02 * torch.randn(width),
                b + "norm2.weight": 1 + 0.1 * torch.randn(width),
                b + "norm2.bias": 0.02 * torch.randn(width),
                b + "mlp.fc1.weight": torch.randn(mlp, width) * width**-0.5,
                b + "mlp.fc1.bias": 0.02 * torch.randn(mlp),
                b + "mlp.fc2.weight": torch.randn(width, mlp) * mlp**-0.5,
                b + "mlp.fc2.bias": 0.02 * torch.randn(width),
            }
        )
        if dino:
            sd[b + "ls1.gamma"] = 0.5 + 0.1 * torch.randn(width)
            sd[b + "ls2.gamma"] = 0.5 + 0.1 * torch.randn(width)
    return {f"{prefix}.{k}": v for k, v in sd.items()}


def write_synthetic_run(
    run_dir: str | Path,
    *,
    seed: int = 0,
    width: int = 32,
    llm_width: int = 48,
    vocab: int = 64 + 256,
    patch: int = 14,
    side: int = 2,
) -> Path:
    """Write a tiny random run directory in the Prismatic / MiniVLA format (fused
    ``dinosiglip`` timm backbones, ``fused-gelu-mlp`` projector, Qwen2 LLM) for tests and docs.
    Attention heads: 2 (vision, width 32) and 2 (LLM, width 48): pass ``vision_heads=2,
    llm_heads=2`` to :func:`load_prismatic` unless the widths are in :data:`HEADS_BY_WIDTH`.
    """
    g = torch.random.fork_rng()
    with g:
        torch.manual_seed(seed)
        vision = {
            **_timm_vit("dino_featurizer", width, 2, patch, side, 2 * width, dino=True),
            **_timm_vit("siglip_featurizer", width, 2, patch, side, 2 * width, dino=False),
        }
        fused = 2 * width
        projector = {
            "projector.0.weight": torch.randn(4 * fused, fused) * fused**-0.5,
            "projector.0.bias": torch.zeros(4 * fused),
            "projector.2.weight": torch.randn(llm_width, 4 * fused) * (4 * fused) ** -0.5,
            "projector.2.bias": torch.zeros(llm_width),
            "projector.4.weight": torch.randn(llm_width, llm_width) * llm_width**-0.5,
            "projector.4.bias": torch.zeros(llm_width),
        }
        from transformers import Qwen2Config, Qwen2ForCausalLM

        llm = Qwen2ForCausalLM(
            Qwen2Config(
                vocab_size=vocab,
                hidden_size=llm_width,
                intermediate_size=2 * llm_width,
                num_hidden_layers=2,
                num_attention_heads=2,
                num_key_value_heads=1,
                tie_word_embeddings=False,
            )
        )
        llm_sd = {f"llm.{k}": v.clone() for k, v in llm.state_dict().items()}
    run_dir = Path(run_dir)
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    torch.save(
        {"model": {"vision_backbone": vision, "projector": projector, "llm_backbone": llm_sd}},
        run_dir / "checkpoints" / "latest-checkpoint.pt",
    )
    (run_dir / "config.json").write_text(
        json.dumps(
            {
                "vla": {
                    "base_vlm": "synthetic",
                    "vision_backbone_id": "dinosiglip-vit-so-224px",
                    "llm_backbone_id": "qwen25-synthetic",
                    "arch_specifier": "no-align+fused-gelu-mlp",
                }
            }
        )
    )
    q01 = [-0.9, -0.8, -0.9, -0.1, -0.1, -0.2, 0.0]
    q99 = [0.9, 0.8, 0.9, 0.1, 0.1, 0.2, 1.0]
    stats = {
        "libero_10_no_noops": {
            "action": {
                "q01": q01,
                "q99": q99,
                "mask": [True] * 6 + [False],
                "mean": [0.0] * 7,
                "std": [0.5] * 7,
                "min": q01,
                "max": q99,
            },
            "num_transitions": 1000,
            "num_trajectories": 10,
        }
    }
    (run_dir / "dataset_statistics.json").write_text(json.dumps(stats))
    return run_dir
