"""MiniVLA: vision encoder(s) + MLP projector + Qwen2 causal LM that emits OpenVLA action tokens.

Architecture (Prismatic / MiniVLA): each camera image goes through a SigLIP vision transformer
(optionally fused with a DINOv2-with-registers one: patch features concatenated along the
channel dimension, as Prismatic's ``dinosiglip`` backbones do; features of the second-to-last
layer), an MLP projector maps patch features to the LM's width, and a Qwen2 causal LM reads
``[BOS] [patches of every camera] [proprio token] [instruction tokens]`` and then predicts the
7 action tokens one by one -- or, with ``action_chunk = K > 1``, the ``7 K`` tokens of the
next ``K`` actions (an action chunk: one decision, one pair of renders and one prefix pass per
``K`` actions; the extra tokens cost only cached decode steps). Action tokens are the last 256
ids of the LM vocabulary (:class:`~agents.vla.tokenizer.ActionTokenizer`). Every module is a ``transformers`` model
built from a config (no timm / torchvision), so the same code runs at CPU-trainable size
(:meth:`MiniVLAConfig.tiny`, ~5-20M parameters) and at full size
(:func:`agents.vla.prismatic.load_prismatic`).

Sampling and the loss use the *same* distribution: the logits of the 256 action tokens only
(every other id masked), divided by the temperature. :meth:`MiniVLA.act` samples a batch
(e.g. a GRPO group) with a KV cache and returns the tokens and their log-probabilities;
:meth:`MiniVLA.token_logprobs` recomputes them teacher-forced, with gradients.

The instruction tokenizer of small models is :class:`WordHashTokenizer` (lower-cased words
hashed into a fixed vocabulary: nothing to download or fit); full-size models use the
checkpoint's Hugging Face tokenizer.

Classes: :class:`MiniVLAConfig`, :class:`MiniVLA`, :class:`ActOutput`, :class:`WordHashTokenizer`.
Functions: :func:`collate`.

>>> import torch; _ = torch.manual_seed(0)
>>> model = MiniVLA(MiniVLAConfig.tiny(image_size=32, patch_size=16))
>>> obs = {"agentview_image": np.zeros((2, 32, 32, 3), np.uint8), "wrist_image": np.zeros((2, 32, 32, 3), np.uint8),
...        "proprio": np.zeros((2, 9), np.float32), "instruction": ["open the drawer"] * 2}
>>> out = model.act(obs, temperature=1.0)
>>> out.actions.shape, tuple(out.tokens.shape), tuple(out.logprobs.shape)
((2, 7), (2, 7), (2, 7))
>>> bool(torch.allclose(model.token_logprobs(obs, out.tokens), out.logprobs, atol=1e-4))
True
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from agents.vla.tokenizer import ActionNormalizer, ActionTokenizer, GripperMode, postprocess_gripper

__all__ = ["MiniVLAConfig", "MiniVLA", "ActOutput", "WordHashTokenizer", "collate", "CAMERAS"]

#: Observation keys of the two LIBERO cameras (upright images, see ``LiberoLongEnv``).
CAMERAS = ("agentview_image", "wrist_image")
_SIGLIP_MEAN, _SIGLIP_STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)
_DINO_MEAN, _DINO_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _heads(width: int, head_dim: int) -> int:
    """The most heads of size >= ``head_dim`` that divide ``width`` (at least 1)."""
    heads = max(1, width // head_dim)
    while width % heads:
        heads -= 1
    return heads


class WordHashTokenizer:
    """Lower-cased words hashed (CRC32) into ids ``3 .. vocab_size - 1``; 0 pad, 1 BOS, 2 EOS.

    >>> tok = WordHashTokenizer(1024)
    >>> tok.encode("Put the BOWL") == tok.encode("put the bowl"), len(tok.encode("put the bowl"))
    (True, 3)
    """

    pad_token_id, bos_token_id, eos_token_id = 0, 1, 2

    def __init__(self, vocab_size: int = 1024):
        if vocab_size < 16:
            raise ValueError(f"vocab_size must be >= 16, got {vocab_size}")
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return [3 + zlib.crc32(w.encode()) % (self.vocab_size - 3) for w in text.lower().replace(".", " ").split()]


@dataclass
class MiniVLAConfig:
    """Shape of a :class:`MiniVLA` (JSON-serialisable; saved next to checkpoints).

    Attributes:
        siglip / dino / llm: keyword arguments of ``transformers``' ``SiglipVisionConfig``,
            ``Dinov2WithRegistersConfig`` (``None`` = no DINOv2 branch) and ``Qwen2Config``.
            ``llm["vocab_size"]`` counts the text vocabulary *plus* the ``n_bins`` action tokens.
        image_size: side the images are resized to (both encoders).
        cameras: observation keys of the images the policy reads, in sequence order.
        use_proprio: add one token projected from the 9-d proprioception (not in OpenVLA;
            helps small models trained on few demonstrations).
        proprio_dim: size of the proprioception vector.
        feature_layer: hidden state of the vision encoders used as patch features
            (Prismatic: -2, the second-to-last layer).
        n_bins: action bins (tokens) per dimension. action_dim: action dimensions.
        text_vocab_size: size of :class:`WordHashTokenizer` (small models); ``None`` when a
            Hugging Face tokenizer is used (full-size checkpoints).
        prompt: the instruction template (``{instruction}`` is replaced).
        gripper_mode: :func:`~agents.vla.tokenizer.postprocess_gripper` mode of decoded actions.
        action_chunk: actions predicted per decision (1: OpenVLA's one action; ``K > 1``:
            the next ``K`` actions, binned like one, executed open loop before the next
            decision). Default 1.
    """

    siglip: dict[str, Any] = field(default_factory=dict)
    dino: dict[str, Any] | None = None
    llm: dict[str, Any] = field(default_factory=dict)
    image_size: int = 64
    cameras: tuple[str, ...] = CAMERAS
    use_proprio: bool = True
    proprio_dim: int = 9
    feature_layer: int = -2
    n_bins: int = 256
    action_dim: int = 7
    text_vocab_size: int | None = 1024
    prompt: str = "{instruction}"
    gripper_mode: GripperMode = "binarize"
    action_chunk: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.action_chunk, int) or self.action_chunk < 1:
            raise ValueError(f"action_chunk must be an int >= 1, got {self.action_chunk!r}")

    @property
    def tokens_per_decision(self) -> int:
        """Action tokens sampled per decision: ``action_chunk * action_dim``."""
        return self.action_chunk * self.action_dim

    @classmethod
    def tiny(
        cls,
        image_size: int = 64,
        patch_size: int = 16,
        width: int = 192,
        llm_width: int = 256,
        vision_layers: int = 4,
        llm_layers: int = 4,
        fuse_dino: bool = False,
        **kwargs: Any,
    ) -> MiniVLAConfig:
        """A CPU-trainable MiniVLA (~5.6M parameters with the defaults: 16 patches per 64 px image)."""
        text_vocab = int(kwargs.pop("text_vocab_size", 1024))
        vision = {
            "hidden_size": width,
            "intermediate_size": 2 * width,
            "num_hidden_layers": vision_layers,
            "num_attention_heads": _heads(width, 32),
            "image_size": image_size,
            "patch_size": patch_size,
        }
        dino = {**vision, "mlp_ratio": 2, "num_register_tokens": 4, "layerscale_value": 1.0} if fuse_dino else None
        if dino is not None:
            dino.pop("intermediate_size")
        llm = {
            "hidden_size": llm_width,
            "intermediate_size": 3 * llm_width,
            "num_hidden_layers": llm_layers,
            "num_attention_heads": _heads(llm_width, 64),
            "num_key_value_heads": max(1, _heads(llm_width, 64) // 2),
            "vocab_size": text_vocab + 256,
            "max_position_embeddings": 1024,
            "tie_word_embeddings": True,
        }
        return cls(siglip=vision, dino=dino, llm=llm, image_size=image_size, text_vocab_size=text_vocab, **kwargs)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["cameras"] = list(self.cameras)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MiniVLAConfig:
        d = dict(d)
        d["cameras"] = tuple(d.get("cameras", CAMERAS))
        return cls(**d)


@dataclass
class ActOutput:
    """What :meth:`MiniVLA.act` returns for a batch of ``B`` observations.

    Attributes:
        actions: ``(B, action_dim)`` float32 env actions (unnormalised, gripper post-processed);
            ``(B, K, action_dim)`` for a model with ``action_chunk = K > 1``.
        tokens: ``(B, T)`` int64 sampled action-token ids (``T = K * action_dim``).
        logprobs: ``(B, T)`` float32 log-probabilities of the tokens under the masked,
            temperature-scaled action distribution (detached).
    """

    actions: np.ndarray
    tokens: torch.Tensor
    logprobs: torch.Tensor


def collate(observations: Sequence[Mapping[str, Any]] | Mapping[str, Any]) -> dict[str, Any]:
    """A batch dict (arrays stacked, ``instruction`` a list) from a list of single observations
    (a dict that is already a batch passes through)."""
    if isinstance(observations, Mapping):
        return dict(observations)
    if not observations:
        raise ValueError("collate: empty batch")
    out: dict[str, Any] = {}
    for key in observations[0]:
        values = [o[key] for o in observations]
        out[key] = list(values) if key == "instruction" else np.stack([np.asarray(v) for v in values])
    return out


class MiniVLA(nn.Module):
    """The policy. ``statistics`` is one dataset's entry of ``dataset_statistics.json``
    (``{"action": {"q01", "q99", "mask"}, "proprio": {...}}``); without it actions are taken
    as already normalised to [-1, 1].
    """

    def __init__(self, config: MiniVLAConfig, statistics: Mapping[str, Any] | None = None, text_tokenizer: Any = None):
        super().__init__()
        from transformers import Qwen2Config, Qwen2ForCausalLM, SiglipVisionConfig, SiglipVisionModel

        self.config = config
        siglip_cfg = SiglipVisionConfig(**{"image_size": config.image_size, **config.siglip})
        self.siglip = SiglipVisionModel(siglip_cfg)
        vision_dim = siglip_cfg.hidden_size
        self.dino: nn.Module | None = None
        if config.dino is not None:
            from transformers import Dinov2WithRegistersConfig, Dinov2WithRegistersModel

            dino_cfg = Dinov2WithRegistersConfig(**{"image_size": config.image_size, **config.dino})
            if dino_cfg.patch_size != siglip_cfg.patch_size:
                raise ValueError("fused DINOv2 and SigLIP need the same patch size (one patch grid)")
            self.dino = Dinov2WithRegistersModel(dino_cfg)
            vision_dim += dino_cfg.hidden_size
        llm_cfg = Qwen2Config(**config.llm)
        self.llm = Qwen2ForCausalLM(llm_cfg)
        width = llm_cfg.hidden_size
        if self.dino is not None:  # Prismatic's fused-gelu-mlp
            self.projector = nn.Sequential(
                nn.Linear(vision_dim, 4 * vision_dim),
                nn.GELU(),
                nn.Linear(4 * vision_dim, width),
                nn.GELU(),
                nn.Linear(width, width),
            )
        else:  # gelu-mlp
            self.projector = nn.Sequential(nn.Linear(vision_dim, width), nn.GELU(), nn.Linear(width, width))
        self.proprio_proj = nn.Linear(config.proprio_dim, width) if config.use_proprio else None
        self.action_tokenizer = ActionTokenizer(llm_cfg.vocab_size, config.n_bins)
        self.text_tokenizer = text_tokenizer or WordHashTokenizer(config.text_vocab_size or 1024)
        self.statistics: dict[str, Any] = {}
        self.normalizer: ActionNormalizer | None = None
        if statistics is not None:
            self.set_statistics(statistics)

    # -- bookkeeping ------------------------------------------------------------------------
    def set_statistics(self, statistics: Mapping[str, Any]) -> None:
        """Install one dataset's statistics (action q01/q99 normalisation, proprio scaling)."""
        self.statistics = json.loads(json.dumps(statistics))
        self.normalizer = ActionNormalizer.from_statistics(self.statistics)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    # -- inputs -------------------------------------------------------------------------------
    def _pixels(
        self, images: np.ndarray | torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]
    ) -> torch.Tensor:
        x = torch.as_tensor(np.asarray(images), device=self.device).float().div(255.0).permute(0, 3, 1, 2)
        if x.shape[-1] != self.config.image_size or x.shape[-2] != self.config.image_size:
            x = F.interpolate(
                x, size=(self.config.image_size,) * 2, mode="bilinear", antialias=True, align_corners=False
            )
        m = torch.tensor(mean, device=x.device).view(1, 3, 1, 1)
        s = torch.tensor(std, device=x.device).view(1, 3, 1, 1)
        return (x - m) / s

    def _patches(self, images: np.ndarray) -> torch.Tensor:
        """``(B, P, width)`` projected patch features of one camera's images."""
        layer = self.config.feature_layer
        feats = self.siglip(
            pixel_values=self._pixels(images, _SIGLIP_MEAN, _SIGLIP_STD), output_hidden_states=True
        ).hidden_states[layer]
        if self.dino is not None:
            out = self.dino(pixel_values=self._pixels(images, _DINO_MEAN, _DINO_STD), output_hidden_states=True)
            skip = 1 + int(getattr(self.dino.config, "num_register_tokens", 0))  # CLS + registers
            feats = torch.cat([out.hidden_states[layer][:, skip:], feats], dim=-1)  # Prismatic: [dino, siglip]
        return self.projector(feats)

    def _proprio(self, proprio: np.ndarray) -> torch.Tensor:
        assert self.proprio_proj is not None
        p = torch.as_tensor(np.asarray(proprio, dtype=np.float32), device=self.device)
        stats = self.statistics.get("proprio")
        if stats is not None:
            mean = torch.tensor(stats["mean"], dtype=torch.float32, device=p.device)
            std = torch.tensor(stats["std"], dtype=torch.float32, device=p.device)
            p = (p - mean) / (std + 1e-6)
        return self.proprio_proj(p).unsqueeze(1)

    def _text_ids(self, instruction: str) -> list[int]:
        text = self.config.prompt.format(instruction=instruction)
        ids = list(self.text_tokenizer.encode(text))
        bos = getattr(self.text_tokenizer, "bos_token_id", None)
        if ids and bos is not None and ids[0] == bos:
            ids = ids[1:]
        return ids

    def prefix(self, obs: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded prefix embeddings ``(B, L, width)`` and attention mask ``(B, L)``."""
        batch = collate(obs) if not isinstance(obs, Mapping) else obs
        instructions = list(batch["instruction"])
        embed = self.llm.get_input_embeddings()
        parts = [self._patches(batch[cam]) for cam in self.config.cameras]
        if self.proprio_proj is not None:
            parts.append(self._proprio(batch["proprio"]))
        visual = torch.cat(parts, dim=1)
        bos = getattr(self.text_tokenizer, "bos_token_id", None)
        bos_id = 1 if bos is None else int(bos)
        rows = []
        for i, text in enumerate(instructions):
            ids = torch.tensor(self._text_ids(text), dtype=torch.long, device=self.device)
            bos_e = embed(torch.tensor([bos_id], device=self.device))
            rows.append(torch.cat([bos_e, visual[i], embed(ids)], dim=0))
        length = max(r.shape[0] for r in rows)
        width = rows[0].shape[1]
        x = rows[0].new_zeros((len(rows), length, width))
        mask = torch.zeros((len(rows), length), dtype=torch.long, device=self.device)
        for i, r in enumerate(rows):
            x[i, length - r.shape[0] :] = r
            mask[i, length - r.shape[0] :] = 1
        return x, mask

    # -- the action distribution -----------------------------------------------------------
    def _action_logits(self, hidden_logits: torch.Tensor, temperature: float) -> torch.Tensor:
        begin = self.action_tokenizer.action_token_begin
        logits = hidden_logits[..., begin : begin + self.config.n_bins].float()
        return logits / temperature if temperature > 0 else logits

    def _forward(
        self, embeds: torch.Tensor, mask: torch.Tensor, past: Any = None, start: torch.Tensor | None = None
    ) -> Any:
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        if start is not None:
            positions = positions[:, -embeds.shape[1] :]
        return self.llm(
            inputs_embeds=embeds,
            attention_mask=mask,
            position_ids=positions,
            cache=past,
            use_cache=past is not None or start is not None,
        )

    @torch.no_grad()
    def act(
        self,
        obs: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> ActOutput:
        """Sample one action (or one chunk of ``action_chunk`` actions) per observation
        (``temperature=0``: greedy; log-probs then at T=1)."""
        batch = collate(obs) if not isinstance(obs, Mapping) else obs
        embeds, mask = self.prefix(batch)
        embed = self.llm.get_input_embeddings()
        tokens, logps = [], []
        out = self._forward(embeds, mask, start=torch.zeros(1))
        past = out.cache
        logits = out.logits[:, -1]
        t = temperature if temperature > 0 else 1.0
        n_tokens = self.config.tokens_per_decision
        for d in range(n_tokens):
            logp = torch.log_softmax(self._action_logits(logits, t), dim=-1)
            if temperature > 0:
                # Drawn on the CPU: rollouts seed a CPU generator whatever the policy's device.
                idx = torch.multinomial(logp.exp().cpu(), 1, generator=generator).squeeze(1).to(logp.device)
            else:
                idx = logp.argmax(-1)
            tokens.append(idx + self.action_tokenizer.action_token_begin)
            logps.append(logp.gather(1, idx[:, None]).squeeze(1))
            if d + 1 < n_tokens:
                mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
                out = self._forward(embed(tokens[-1])[:, None], mask, past=past, start=torch.zeros(1))
                past, logits = out.cache, out.logits[:, -1]
        tok = torch.stack(tokens, 1)
        return ActOutput(self.decode(tok.cpu().numpy()), tok.cpu(), torch.stack(logps, 1).cpu())

    def decode(self, tokens: np.ndarray) -> np.ndarray:
        """Env actions from action tokens: bin centres, unnormalised, gripper post-processed;
        ``(B, K, action_dim)`` for a chunked model."""
        a = self.action_tokenizer.decode(tokens)
        if self.config.action_chunk > 1:
            a = a.reshape(a.shape[0], self.config.action_chunk, self.config.action_dim)
        if self.normalizer is not None:
            a = self.normalizer.unnormalize(a)
        return postprocess_gripper(a, self.config.gripper_mode)

    def encode_actions(self, actions: np.ndarray) -> np.ndarray:
        """``(B, tokens_per_decision)`` action tokens of env actions (normalised with the
        statistics first): ``(B, action_dim)`` actions, or ``(B, K, action_dim)`` chunks for a
        chunked model."""
        a = np.asarray(actions, dtype=np.float32)
        want = (self.config.action_chunk, self.config.action_dim)
        if self.config.action_chunk > 1 and a.shape[1:] != want:
            raise ValueError(
                f"a model with action_chunk={want[0]} encodes (B, {want[0]}, {want[1]}) chunks, got {a.shape}"
            )
        if self.normalizer is not None:
            a = self.normalizer.normalize(a)
        return self.action_tokenizer.encode(a).reshape(a.shape[0], -1)

    def action_logits(
        self, obs: Mapping[str, Any] | Sequence[Mapping[str, Any]], tokens: torch.Tensor, temperature: float = 1.0
    ) -> torch.Tensor:
        """Teacher-forced ``(B, action_dim, n_bins)`` masked, temperature-scaled logits."""
        batch = collate(obs) if not isinstance(obs, Mapping) else obs
        embeds, mask = self.prefix(batch)
        tokens = torch.as_tensor(tokens, dtype=torch.long, device=self.device)
        embeds = torch.cat([embeds, self.llm.get_input_embeddings()(tokens[:, :-1])], dim=1)
        mask = torch.cat([mask, mask.new_ones((mask.shape[0], tokens.shape[1] - 1))], dim=1)
        logits = self._forward(embeds, mask).logits[:, -tokens.shape[1] :]
        return self._action_logits(logits, temperature if temperature > 0 else 1.0)

    def token_logprobs(
        self,
        obs: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        tokens: torch.Tensor,
        temperature: float = 1.0,
        with_entropy: bool = False,
    ) -> Any:
        """``(B, action_dim)`` log-probabilities of ``tokens`` (with grad); with ``with_entropy``
        a pair ``(logprobs, entropy)``."""
        logp = torch.log_softmax(self.action_logits(obs, tokens, temperature), dim=-1)
        idx = torch.as_tensor(tokens, device=self.device) - self.action_tokenizer.action_token_begin
        out = logp.gather(-1, idx[..., None]).squeeze(-1)
        if with_entropy:
            return out, -(logp.exp() * logp).sum(-1)
        return out

    # -- persistence ------------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """``path/`` with ``config.json``, ``dataset_statistics.json`` and ``model.pt``."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(
            json.dumps({"format": "wmrl-minivla/1", "model": self.config.to_dict()}, indent=1)
        )
        (path / "dataset_statistics.json").write_text(json.dumps({"wmrl": self.statistics}, indent=1))
        torch.save(self.state_dict(), path / "model.pt")
        return path

    @classmethod
    def load(cls, path: str | Path, map_location: str = "cpu") -> MiniVLA:
        """Load what :meth:`save` wrote (for a Prismatic run directory use
        :func:`agents.vla.prismatic.load_prismatic`)."""
        path = Path(path)
        meta = json.loads((path / "config.json").read_text())
        if meta.get("format") != "wmrl-minivla/1":
            raise ValueError(
                f"{path} is not a wmrl MiniVLA checkpoint; for Prismatic runs use agents.vla.prismatic.load_prismatic"
            )
        stats = json.loads((path / "dataset_statistics.json").read_text())
        model = cls(MiniVLAConfig.from_dict(meta["model"]))
        entry: dict[str, Any] = next(iter(stats.values()), {})
        if entry:
            model.set_statistics(entry)
        model.load_state_dict(torch.load(path / "model.pt", map_location=map_location, weights_only=True))
        return model.eval()
