"""MiniVLA action tokenizer: OpenVLA binning, q01/q99 normalisation, gripper, residual VQ."""

from __future__ import annotations

import json

import numpy as np
import pytest

from agents.vla.tokenizer import (
    ActionNormalizer,
    ActionTokenizer,
    ResidualVQChunker,
    dataset_statistics,
    postprocess_gripper,
)


def test_round_trip_error_at_most_half_a_bin():
    tok = ActionTokenizer(vocab_size=50_000)
    a = np.random.default_rng(0).uniform(-1, 1, (20_000, 7))
    a[:7, :] = np.array([-1.0, 1.0, 0.0, -1 + 1e-9, 1 - 1e-9, 1 / 255, -1 / 255])[:, None]
    ids = tok.encode(a)
    assert ids.min() >= 50_000 - 256 and ids.max() <= 49_999
    assert np.abs(tok.decode(ids) - a).max() <= 1 / 255 + 1e-7


def test_matches_openvla_formula():
    # OpenVLA: token = vocab - digitize(a, linspace(-1, 1, 256)); decode to bin centres.
    tok = ActionTokenizer(vocab_size=32_000)
    bins = np.linspace(-1, 1, 256)
    centres = (bins[:-1] + bins[1:]) / 2
    a = np.array([-0.73, 0.0, 0.5, 0.999])
    ids = 32_000 - np.digitize(a, bins)
    assert tok.encode(a).tolist() == ids.tolist()
    assert np.allclose(tok.decode(ids), centres[np.clip(32_000 - ids - 1, 0, 254)])
    # out-of-range actions clip; monotone: a larger action gets a smaller id
    assert tok.encode(np.array([5.0]))[0] == tok.encode(np.array([1.0]))[0]
    assert np.all(np.diff(tok.encode(np.linspace(-1, 1, 1000))) <= 0)
    assert tok.to_bins(tok.from_bins(np.arange(256))).tolist() == list(range(256))


def test_tokenizer_rejects_bad_sizes():
    with pytest.raises(ValueError):
        ActionTokenizer(vocab_size=100, n_bins=256)


def test_q99_normalisation_in_dataset_statistics_format(tmp_path):
    rng = np.random.default_rng(1)
    actions = np.concatenate([rng.normal(0, 0.3, (5000, 6)), rng.choice([-1.0, 1.0], (5000, 1))], 1)
    stats = {"libero_10_wmrl": dataset_statistics(actions)}
    path = tmp_path / "dataset_statistics.json"
    path.write_text(json.dumps(stats))
    norm = ActionNormalizer.load(path)
    s = stats["libero_10_wmrl"]["action"]
    assert set(s) >= {"mean", "std", "min", "max", "q01", "q99", "mask"} and s["mask"] == [True] * 6 + [False]
    x = norm.normalize(actions)
    assert x[:, :6].min() >= -1 and x[:, :6].max() <= 1
    assert np.array_equal(x[:, 6], actions[:, 6])  # gripper untouched
    inside = (actions[:, :6] > s["q01"][:6]) & (actions[:, :6] < s["q99"][:6])
    back = norm.unnormalize(x)
    assert np.allclose(back[:, :6][inside], actions[:, :6][inside], atol=1e-5)
    # through the tokenizer: error <= half a bin in normalised units
    tok = ActionTokenizer(1000)
    err = np.abs(norm.unnormalize(tok.decode(tok.encode(x)))[:, :6] - actions[:, :6])
    half_bin = (np.array(s["q99"][:6]) - np.array(s["q01"][:6])) / 255
    assert np.all(err[inside] <= np.broadcast_to(half_bin, err.shape)[inside] + 1e-5)
    with pytest.raises(ValueError, match="name one"):
        ActionNormalizer.from_statistics({"a": stats["libero_10_wmrl"], "b": stats["libero_10_wmrl"]})
    assert ActionNormalizer.from_statistics({"a": stats["libero_10_wmrl"], "b": {}}, "a").q01.shape == (7,)


def test_gripper_postprocessing():
    # OpenVLA LIBERO convention: dataset gripper 1 = open -> env -1 (open)
    out = postprocess_gripper(np.array([[0, 0, 0, 0, 0, 0, 0.97], [0, 0, 0, 0, 0, 0, 0.02]]), "openvla")
    assert out[:, -1].tolist() == [-1.0, 1.0]
    out = postprocess_gripper(np.array([0.1, 0.2, 0.3, 0, 0, 0, 0.3]), "binarize")
    assert out.tolist()[:3] == pytest.approx([0.1, 0.2, 0.3]) and out[-1] == 1.0
    assert postprocess_gripper(np.array([0.0, -0.2]), "binarize")[-1] == -1.0
    with pytest.raises(ValueError):
        postprocess_gripper(np.zeros(7), "flip")  # type: ignore[arg-type]


def test_residual_vq_chunks_reduce_error_per_level_and_round_trip_state():
    rng = np.random.default_rng(0)
    chunks = np.tanh(rng.normal(size=(600, 8, 7)).cumsum(1) * 0.2)
    vq = ResidualVQChunker(chunk=8, dim=7, levels=4, codebook_size=32, iters=8).fit(chunks)
    errors = [vq.error(chunks, levels=k) for k in range(1, 5)]
    assert all(b < a for a, b in zip(errors, errors[1:]))
    codes = vq.encode(chunks)
    assert codes.shape == (600, 4) and codes.max() < 32
    again = ResidualVQChunker.from_state_dict(json.loads(json.dumps(vq.state_dict())))
    assert np.array_equal(again.encode(chunks), codes)
    with pytest.raises(ValueError):
        vq.encode(np.zeros((3, 4, 7)))
