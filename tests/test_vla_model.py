"""MiniVLA model: act / token_logprobs agree, the GRPO loss starts unclipped, the Prismatic
checkpoint conversion reproduces a timm reference forward, save / load round trip."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from agents.grpo import grpo_loss
from agents.vla.model import MiniVLA, MiniVLAConfig, WordHashTokenizer, collate
from agents.vla.prismatic import convert_state_dict, load_prismatic, write_synthetic_run
from agents.vla.tokenizer import dataset_statistics


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    actions = np.random.default_rng(0).normal(0, 0.3, (200, 7))
    stats = dataset_statistics(actions, proprio=np.random.default_rng(1).normal(size=(200, 9)))
    return MiniVLA(MiniVLAConfig.tiny(image_size=32, patch_size=16, width=64, llm_width=96, llm_layers=2), stats).eval()


def _obs(n, seed=0, instructions=None):
    rng = np.random.default_rng(seed)
    return {
        "agentview_image": rng.integers(0, 255, (n, 32, 32, 3), dtype=np.uint8),
        "wrist_image": rng.integers(0, 255, (n, 32, 32, 3), dtype=np.uint8),
        "proprio": rng.normal(size=(n, 9)).astype(np.float32),
        "instruction": instructions or ["put both the alphabet soup and the cream cheese box in the basket"] * n,
    }


def test_tiny_size_is_cpu_trainable():
    with torch.device("meta"):  # shapes only
        m = MiniVLA(MiniVLAConfig.tiny())
        fused = MiniVLA(MiniVLAConfig.tiny(fuse_dino=True))
    assert 5e6 <= m.num_parameters() <= 20e6
    assert fused.dino is not None and m.num_parameters() < fused.num_parameters() <= 20e6


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_behaviour_logprobs_equal_recomputed_with_mixed_prompt_lengths(model, temperature):
    obs = _obs(
        4, instructions=["open the drawer", "put both moka pots on the stove", "a", "turn on the stove and put it"]
    )
    out = model.act(obs, temperature=temperature, generator=torch.Generator().manual_seed(0))
    lo = model.action_tokenizer.action_token_begin
    assert out.tokens.min() >= lo and out.tokens.max() < lo + 256
    recomputed = model.token_logprobs(obs, out.tokens, temperature=temperature)
    assert torch.allclose(recomputed, out.logprobs, atol=1e-4)
    # one observation at a time gives the same numbers as the left-padded batch
    single = model.token_logprobs(
        collate([{k: v[1] for k, v in obs.items()}]), out.tokens[1:2], temperature=temperature
    )
    assert torch.allclose(single, out.logprobs[1:2], atol=1e-4)
    # first GRPO epoch: ratio 1, nothing clipped
    loss = grpo_loss(recomputed, out.logprobs, torch.tensor([1.0, -1.0, 0.5, -0.5]), torch.ones_like(recomputed))
    assert loss.metrics["clip_frac"] == 0.0 and abs(loss.metrics["ratio_mean"] - 1.0) < 1e-4
    loss.loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.llm.parameters())
    model.zero_grad()


def test_greedy_is_deterministic_and_actions_decode_in_env_range(model):
    obs = _obs(3)
    a, b = model.act(obs, temperature=0.0), model.act(obs, temperature=0.0)
    assert torch.equal(a.tokens, b.tokens)
    assert a.actions.shape == (3, 7) and np.all(np.isin(a.actions[:, -1], [-1.0, 1.0]))
    assert np.all(np.isfinite(a.actions))
    # encode(decode) stays within a bin of the tokens
    assert np.abs(model.encode_actions(model.decode(a.tokens.numpy()))[:, :6] - a.tokens.numpy()[:, :6]).max() <= 1


def test_sft_cross_entropy_decreases_on_one_batch(model):
    m = MiniVLA(model.config, model.statistics).train()
    obs = _obs(4, seed=3)
    target = torch.as_tensor(m.encode_actions(np.random.default_rng(2).normal(0, 0.3, (4, 7))))
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        logits = m.action_logits(obs, target)
        loss = F.cross_entropy(logits.reshape(-1, 256), (target - m.action_tokenizer.action_token_begin).reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0]


def test_save_load_round_trip(model, tmp_path):
    model.save(tmp_path / "ckpt")
    again = MiniVLA.load(tmp_path / "ckpt")
    obs = _obs(2, seed=5)
    tokens = model.act(obs, temperature=0.0).tokens
    assert torch.allclose(again.token_logprobs(obs, tokens), model.token_logprobs(obs, tokens), atol=1e-5)
    assert again.statistics == model.statistics


def _timm_vit_features(sd, prefix, pixels, depth, heads, *, dino, registers=4, act="tanh"):
    """A from-scratch timm ViT forward (second-to-last block output, prefix tokens dropped)."""
    p = {k[len(prefix) + 1 :]: v for k, v in sd.items() if k.startswith(prefix + ".")}
    x = F.conv2d(
        pixels, p["patch_embed.proj.weight"], p["patch_embed.proj.bias"], stride=p["patch_embed.proj.weight"].shape[-1]
    )
    x = x.flatten(2).transpose(1, 2) + p["pos_embed"]
    n_prefix = 0
    if dino:
        b = x.shape[0]
        x = torch.cat([p["cls_token"].expand(b, -1, -1), p["reg_token"].expand(b, -1, -1), x], 1)
        n_prefix = 1 + registers
    width = x.shape[-1]
    for i in range(depth - 1):  # second-to-last block's output
        q = f"blocks.{i}."
        h = F.layer_norm(x, (width,), p[q + "norm1.weight"], p[q + "norm1.bias"], eps=1e-6)
        qkv = F.linear(h, p[q + "attn.qkv.weight"], p[q + "attn.qkv.bias"]).reshape(
            x.shape[0], x.shape[1], 3, heads, -1
        )
        qq, kk, vv = qkv.permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(qq, kk, vv).transpose(1, 2).reshape(x.shape)
        att = F.linear(att, p[q + "attn.proj.weight"], p[q + "attn.proj.bias"])
        x = x + (att * p[q + "ls1.gamma"] if dino else att)
        h = F.layer_norm(x, (width,), p[q + "norm2.weight"], p[q + "norm2.bias"], eps=1e-6)
        h = F.linear(
            F.gelu(F.linear(h, p[q + "mlp.fc1.weight"], p[q + "mlp.fc1.bias"]), approximate=act),
            p[q + "mlp.fc2.weight"],
            p[q + "mlp.fc2.bias"],
        )
        x = x + (h * p[q + "ls2.gamma"] if dino else h)
    return x[:, n_prefix:]


def test_synthetic_prismatic_checkpoint_loads_matches_timm_reference_and_acts(tmp_path):
    run = write_synthetic_run(tmp_path / "run", seed=1)
    model = load_prismatic(run, tokenizer=WordHashTokenizer(64))
    assert model.config.dino is not None and model.config.gripper_mode == "openvla"
    assert model.action_tokenizer.vocab_size == 64 + 256
    state = torch.load(run / "checkpoints" / "latest-checkpoint.pt", weights_only=True)["model"]
    vision = {k: v for k, v in state["vision_backbone"].items()}
    img = np.random.default_rng(0).integers(0, 255, (2, 28, 28, 3), dtype=np.uint8)
    with torch.no_grad():
        ours = model._patches(img)  # projector([dino, siglip]) as Prismatic's fused backbone
        sig = _timm_vit_features(
            vision, "siglip_featurizer", model._pixels(img, (0.5,) * 3, (0.5,) * 3), 2, 2, dino=False
        )
        dino = _timm_vit_features(
            vision,
            "dino_featurizer",
            model._pixels(img, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
            2,
            2,
            dino=True,
            act="none",
        )
        ref = model.projector(torch.cat([dino, sig], -1))
    assert torch.allclose(ours, ref, atol=1e-4)
    # every converted tensor is used, and the LLM weights are the checkpoint's
    converted = convert_state_dict(state)
    assert set(converted) <= set(model.state_dict())
    assert torch.equal(model.llm.lm_head.weight, state["llm_backbone"]["llm.lm_head.weight"])
    obs = {"agentview_image": img, "instruction": ["put both moka pots on the stove"] * 2}
    out = model.act(obs, temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert out.actions.shape == (2, 7) and np.all(np.isin(out.actions[:, -1], [-1.0, 1.0]))
    assert torch.allclose(model.token_logprobs(obs, out.tokens), out.logprobs, atol=1e-4)
    # unnormalised with the run's q01 / q99
    assert np.all(np.abs(out.actions[:, :3]) <= 0.9 + 1e-5)


def test_prismatic_load_errors(tmp_path):
    run = write_synthetic_run(tmp_path / "run")
    with pytest.raises(ValueError, match="tokenizer"):
        load_prismatic(run)
    state = torch.load(run / "checkpoints" / "latest-checkpoint.pt", weights_only=True)
    del state["model"]["vision_backbone"]
    with pytest.raises(KeyError, match="vision_backbone"):
        convert_state_dict(state["model"])
