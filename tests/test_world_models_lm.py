"""Tests of LMWorldModel: parsing, prompts, batched generation on a tiny from-config LM,
and (slow) the offline SmolLM2 default."""

from __future__ import annotations

import importlib.util

import pytest

from wmrl_envs import smollm2
from wmrl_envs.world_models import QUALITY_BUCKETS, WorldModel, parse_last_json, parse_prediction
from wmrl_envs.world_models.lm import LMWorldModel, LMWorldModelConfig, build_messages

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CONTEXT = {
    "task_id": "t0",
    "overview": "Predict species of penguins from measurements.",
    "meta_features": {"task_type": "multiclass", "n_train": 250},
}
SCRIPT = "import pandas as pd\ntrain = pd.read_csv('data/train.csv')\nprint(train.shape)\n"
ANSWER = '{"status": "runtime_error", "feedback": "KeyError: species"}'


# ----------------------------------------------------------------- parsing
@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"status": "valid"}', {"status": "valid"}),
        (
            'I think {"a": {"b": 1}} and then {"status": "timeout", "feedback": "} {"}',
            {"status": "timeout", "feedback": "} {"},
        ),
        ('```json\n{"status": "valid", "quality": "good"}\n```', {"status": "valid", "quality": "good"}),
        ("no json at all", None),
        ('{"status": "valid", "quality": ', None),
        ('[1, 2] {"x": 1', None),
        ('{"x": 1} {broken', {"x": 1}),
    ],
)
def test_parse_last_json(text, expected):
    assert parse_last_json(text) == expected


def test_parse_prediction_bucket_map_and_unknowns():
    assert QUALITY_BUCKETS == {"very_poor": 0.1, "poor": 0.3, "average": 0.5, "good": 0.7, "excellent": 0.9}
    for bucket, pct in QUALITY_BUCKETS.items():
        o = parse_prediction(f'{{"status": "valid", "quality": "{bucket}", "feedback": "cv 0.8"}}')
        assert o.score == pytest.approx(0.5 + 0.5 * pct) and o.metrics == {"quality": bucket, "percentile": pct}
        assert o.feedback == "cv 0.8" and o.source == "wm"
    assert parse_prediction('{"status": "Very Poor"}') is None  # not a status
    assert parse_prediction('{"status": "no submission", "quality": "excellent"}').score == 0.2
    assert parse_prediction('{"status": "SYNTAX-ERROR"}').score == 0.0
    assert parse_prediction('{"status": "valid", "quality": "great"}') is None
    assert parse_prediction('{"status": "valid", "quality": 5}') is None
    assert parse_prediction('{"quality": "good"}') is None
    assert parse_prediction("") is None
    assert parse_prediction('{"status": "timeout", "feedback": {"t": 60}}').feedback == '{"t": 60}'


def test_build_messages_numbers_lines_and_cuts():
    cfg = LMWorldModelConfig(max_overview_chars=20, max_code_lines=2)
    ctx = {**CONTEXT, "feedback": "Turn 1: KeyError 'y'"}
    system, user = build_messages(ctx, SCRIPT, cfg)
    assert system["role"] == "system" and user["role"] == "user"
    text = user["content"]
    assert (
        "   1| import pandas as pd" in text
        and "   2| train = " in text
        and "   3|" not in text
        and "1 more lines" in text
    )
    assert (
        "overview cut" in text
        and "- meta_features.task_type: multiclass" in text
        and "- meta_features.n_train: 250" in text
    )
    assert "KeyError 'y'" in text and "t0" not in text  # the task id is no fact worth a token
    assert '"quality"' in text and "very_poor" in text


# ------------------------------------------------------------- tiny LM
def _tiny_lm():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<pad>", "<eos>", "<unk>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    corpus = [m["content"] for m in build_messages(CONTEXT, SCRIPT)] + [ANSWER, SCRIPT * 3]
    tok.train_from_iterator(corpus, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")
    tokenizer.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=4, max_position_embeddings=2048, pad_token_id=tokenizer.pad_token_id,
                      eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id)  # fmt: skip
    return LlamaForCausalLM(cfg).eval(), tokenizer


@pytest.fixture(scope="module")
def tiny():
    # One torch thread: on a shared 2-core machine intra-op threads spin against each
    # other (measured here: 2.0 s vs 0.05 s per training step of this tiny model).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield _tiny_lm()
    torch.set_num_threads(threads)


def test_tiny_lm_predict_shapes_gate_and_none(tiny):
    model, tokenizer = tiny
    wm = LMWorldModel(LMWorldModelConfig(max_new_tokens=12, batch_size=2), model=model, tokenizer=tokenizer)
    assert isinstance(wm, WorldModel)
    out = wm.predict([CONTEXT, CONTEXT, {"overview": "x"}], [SCRIPT, "def f(:", SCRIPT + "x = 1\n" * 5])
    assert len(out) == 3 and len(wm.last_texts) == 2  # the syntax error never reaches the LM
    assert out[1].status == "syntax_error" and out[1].score == 0.0 and out[1].source == "wm"
    # An untrained LM writes no JSON: unknown, never a guessed score.
    assert out[0] is None and out[2] is None
    with pytest.raises(ValueError, match="pass both model and tokenizer"):
        LMWorldModel(model=model)


def test_trained_tiny_lm_answers_through_batched_generation(tiny):
    """Teach the tiny LM one answer, then check the whole path (prompt, left-padded batch
    generation, parsing, feedback) returns it, for prompts of different lengths."""
    model, tokenizer = tiny
    wm = LMWorldModel(LMWorldModelConfig(max_new_tokens=40, batch_size=4), model=model, tokenizer=tokenizer)
    prompts = [wm.render(CONTEXT, SCRIPT), wm.render({**CONTEXT, "overview": "Short."}, SCRIPT)]
    # The prompt ends in the answer prefix; the model learns the rest of the answer.
    assert prompts[0].endswith(wm.config.answer_prefix) and ANSWER.startswith(wm.config.answer_prefix)
    target = tokenizer(ANSWER[len(wm.config.answer_prefix) :] + "<eos>", add_special_tokens=False)["input_ids"]
    seqs = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    width = max(map(len, seqs)) + len(target)
    pad = tokenizer.pad_token_id
    x = torch.tensor([ids + target + [pad] * (width - len(ids) - len(target)) for ids in seqs])
    labels = torch.tensor([[-100] * len(ids) + target + [-100] * (width - len(ids) - len(target)) for ids in seqs])
    mask = (labels != -100) | (torch.arange(width)[None, :] < torch.tensor([[len(ids)] for ids in seqs]))
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    for _ in range(100):
        loss = model(input_ids=x, attention_mask=mask.long(), labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    out = wm.predict([CONTEXT, {**CONTEXT, "overview": "Short."}], [SCRIPT, SCRIPT])
    assert [o.status if o else None for o in out] == ["runtime_error", "runtime_error"], wm.last_texts
    assert out[0].score == 0.1 and out[0].feedback == "KeyError: species" and out[0].cost > 0
    assert wm.last_texts[0].startswith(ANSWER)


def test_vllm_backend_requires_vllm():
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here; the missing-package error cannot be shown")
    with pytest.raises(ImportError, match="needs the vllm package"):
        LMWorldModel(LMWorldModelConfig(backend="vllm"))
    with pytest.raises(ValueError, match="backend"):
        LMWorldModelConfig(backend="tgi")


# ------------------------------------------------------- SmolLM2 default
def test_smollm2_gguf_is_found():
    file = smollm2.gguf_file()
    assert file.name.endswith(".gguf") and file.is_file()


def test_default_lm_world_model_and_policy_share_one_cached_loader(monkeypatch):
    """Both load SmolLM2 through wmrl_envs.smollm2 (de-quantised once, cached), never the GGUF directly."""
    calls = []

    class Loaded:
        def to(self, device):
            return self

        def eval(self):
            return self

    def fake_model(dtype=None):
        calls.append("model")
        return Loaded()

    def fake_tokenizer():
        calls.append("tokenizer")
        return type("Tok", (), {"pad_token": "x", "eos_token": "x", "padding_side": "right"})()

    monkeypatch.setattr(smollm2, "load_model", fake_model)
    monkeypatch.setattr(smollm2, "load_tokenizer", fake_tokenizer)
    wm = LMWorldModel(LMWorldModelConfig(backend="transformers"))
    assert isinstance(wm.model, Loaded) and calls == ["model", "tokenizer"]
    pytest.importorskip("transformers")
    from agents.llm import policy

    assert policy.DEFAULT_MODEL == smollm2.NAME and policy.smollm2 is smollm2


@pytest.mark.slow
@pytest.mark.llm
def test_smollm2_default_answers_parseable_or_none():
    wm = LMWorldModel(LMWorldModelConfig(max_new_tokens=48, batch_size=2, num_threads=1))
    out = wm.predict([CONTEXT, CONTEXT], [SCRIPT, SCRIPT.replace("train.shape", "train.columns")])
    assert len(out) == 2 and len(wm.last_texts) == 2 and all(isinstance(t, str) and t for t in wm.last_texts)
    for o, text in zip(out, wm.last_texts):
        parsed = parse_prediction(text)
        if parsed is None:
            assert o is None
        else:
            assert (o.status, o.score, o.feedback, o.source) == (parsed.status, parsed.score, parsed.feedback, "wm")
