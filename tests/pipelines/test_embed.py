"""Sentence embeddings: sentence-transformers parity on all-MiniLM-L6-v2, round trips, the layout, clear errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

from conftest import make_corpus
from unmask.config import BertConfig
from unmask.data.windows import make_windows
from unmask.errors import CheckpointError
from unmask.models.bert import BertModel
from unmask.pipelines.embed import SentenceEncoder, pool

st = pytest.importorskip("sentence_transformers")


def varied_sentences() -> list[str]:
    """200 sentences: short, long (past max_seq_length), punctuation, accents, CJK, digits, one word."""
    sentences = make_corpus(140, seed=7)
    sentences += [" ".join(make_corpus(n, seed=n)) for n in range(1, 41)]  # 1 to 40 clauses: up to ~500 tokens
    sentences += ["a", "Hello, world!", "Ünïcödé naïve café ✓", "中文字符和标点。", "3.14159 is pi; e is 2.71828",
                  "ALL CAPS SENTENCE HERE", "tabs\tand  spaces", "emoji 🙂🙂🙂", "(parenthetical) [bracketed]",
                  "don't won't can't shouldn't", "https://example.com/path?q=1", "x" * 300,
                  "The quick brown fox jumps over the lazy dog.", "Is this a question?", "#hashtag @mention",
                  "line one. line two. line three.", "—dashes–and…ellipses", "日本語のテキスト", "Ελληνικά κείμενα",
                  "Русский текст здесь"]
    assert len(sentences) == 200
    return sentences


@pytest.fixture(scope="module")
def st_model(minilm_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return st.SentenceTransformer(str(minilm_dir), device="cpu")


def cosine_gap(a: np.ndarray, b: np.ndarray) -> float:
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    return float(np.abs(cos - 1).max())


def test_minilm_matches_sentence_transformers(minilm_dir, st_model):
    encoder = SentenceEncoder.from_pretrained(minilm_dir)
    assert (encoder.pooling, encoder.normalize, encoder.max_seq_length) == ("mean", True, 256)
    sentences = varied_sentences()
    with pytest.warns(UserWarning, match="were truncated"):  # what sentence-transformers does, silently
        ours = encoder.encode(sentences, batch_size=16, truncation="truncate")
    theirs = st_model.encode(sentences, batch_size=16, convert_to_numpy=True)
    assert ours.shape == (200, 384) and ours.dtype == np.float32
    assert cosine_gap(ours, theirs) <= 1e-5
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_long_inputs_are_the_mean_of_their_windows(minilm_dir):
    encoder = SentenceEncoder.from_pretrained(minilm_dir, max_seq_length=32)
    text = " ".join(make_corpus(8, seed=3))  # ~100 tokens
    short = "the sailor painted the lighthouse"
    windows = make_windows([(e.ids, e.type_ids) for e in encoder.tokenize([text])], 32, stride=8)
    assert len(windows) >= 3 and all(len(ids) <= 32 for ids in windows.input_ids)
    # each window embedded on its own (mean pooling, unnormalised), then averaged and normalised
    with torch.no_grad():
        window_vectors = [encoder.model(torch.tensor([ids])).last_hidden_state[0].mean(0).numpy()
                          for ids in windows.input_ids]
    expected = np.mean(window_vectors, axis=0)
    expected /= np.linalg.norm(expected)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # chunking loses nothing, so it does not warn
        ours = encoder.encode([short, text], stride=8)
    assert cosine_gap(ours[1:], expected[None]) <= 1e-5
    # short inputs: one window, the same vector (up to float rounding: on AVX-512 / AMX CPUs oneDNN picks its
    # kernels by batch shape, so a text batched with others may differ in the last bit)
    assert cosine_gap(ours[:1], encoder.encode([short], truncation="error")) <= 1e-6


def test_encode_runs_without_dropout_and_keeps_the_training_mode(minilm_dir):
    """Mid-fine-tuning the model is in training mode; encode (each epoch's evaluation) must not embed with dropout."""
    encoder = SentenceEncoder.from_pretrained(minilm_dir)
    sentences = ["the sailor painted the lighthouse", "a storm came in from the sea at night"]
    expected = encoder.encode(sentences)
    encoder.model.train()
    assert cosine_gap(encoder.encode(sentences), expected) <= 1e-6  # with dropout 0.1 it is ~1e-2
    assert encoder.model.training


def test_loading_leaves_the_random_stream_where_it_was(minilm_dir):
    """The encoder's random init, overwritten by the checkpoint, must not shift the dropout masks of the training
    that follows: a seed gives the same stream as in sentence-transformers, whose loading draws nothing."""
    torch.manual_seed(5)
    SentenceEncoder.from_pretrained(minilm_dir)
    after_loading = torch.rand(4)
    torch.manual_seed(5)
    assert torch.equal(torch.rand(4), after_loading)


def test_truncation_error_mode_and_bad_sentences(minilm_dir):
    encoder = SentenceEncoder.from_pretrained(minilm_dir)
    with pytest.raises(ValueError, match="input 0 is 302 tokens, longer than the context of 256"):
        encoder.encode(["word " * 300], truncation="error")
    with pytest.raises(ValueError, match="sentence 1 is empty"):
        encoder.encode(["fine", "  "])
    with pytest.raises(TypeError, match="list of sentences"):
        encoder.encode("a bare string")


def test_pooling_modes():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, -4.0], [100.0, 100.0]]])  # the third position is padding
    mask = torch.tensor([[1, 1, 0]])
    assert pool(hidden, mask, "mean").tolist() == [[2.0, -1.0]]
    assert pool(hidden, mask, "cls").tolist() == [[1.0, 2.0]]
    assert pool(hidden, mask, "max").tolist() == [[3.0, 2.0]]


@pytest.mark.parametrize("pooling", ["mean", "cls", "max"])
def test_our_directory_loads_in_sentence_transformers_and_transformers(tmp_path, tokenizer, pooling):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64)
    encoder = SentenceEncoder(BertModel(config), tokenizer, pooling=pooling, normalize=pooling == "mean",
                              max_seq_length=48)
    encoder.save_pretrained(tmp_path)
    sentences = make_corpus(30, seed=1) + ["the sailor " * 40]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = encoder.encode(sentences)
        theirs = st.SentenceTransformer(str(tmp_path), device="cpu").encode(sentences, convert_to_numpy=True)
    assert cosine_gap(ours, theirs) <= 1e-5 and np.abs(ours - theirs).max() < 1e-5
    again = SentenceEncoder.from_pretrained(tmp_path)
    assert (again.pooling, again.normalize, again.max_seq_length) == (pooling, pooling == "mean", 48)
    hf = transformers.AutoModel.from_pretrained(str(tmp_path)).eval()
    enc = transformers.AutoTokenizer.from_pretrained(str(tmp_path))(sentences[:5], padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = hf(**enc).last_hidden_state
    vectors = pool(hidden, enc["attention_mask"], pooling)
    if pooling == "mean":
        vectors = torch.nn.functional.normalize(vectors, dim=-1)
    assert np.abs(vectors.numpy() - ours[:5]).max() < 1e-5


def test_pretrained_tiny_model_round_trip(tmp_path, corpus_file, tokenizer_dir):
    """Pretrain a tiny model, save it as a sentence-transformers directory, read it back everywhere."""
    from unmask.train.pretrain import PretrainArgs, pretrain

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 2,
                                  "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64}))
    pretrain(PretrainArgs(train_file=[str(corpus_file)], output_dir=str(tmp_path / "mlm"), model_config=str(config),
                          tokenizer=str(tokenizer_dir), max_seq_length=32, per_device_train_batch_size=8,
                          max_steps=10, cache_dir=str(tmp_path / "cache"), show_progress=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        encoder = SentenceEncoder.from_pretrained(tmp_path / "mlm")  # an MLM directory: no pooler, mean pooling
        encoder.save_pretrained(tmp_path / "st")
        sentences = make_corpus(20, seed=5)
        theirs = st.SentenceTransformer(str(tmp_path / "st"), device="cpu").encode(sentences, convert_to_numpy=True)
    ours = encoder.encode(sentences)
    assert cosine_gap(ours, theirs) <= 1e-5
    assert np.abs(SentenceEncoder.from_pretrained(tmp_path / "st").encode(sentences) - ours).max() == 0


def test_clear_errors_for_directories_that_do_not_fit(tmp_path, minilm_dir, tokenizer_dir):
    model_dir = tmp_path / "m"
    shutil.copytree(minilm_dir, model_dir)
    (model_dir / "1_Pooling" / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"1_Pooling/config.json: missing"):
        SentenceEncoder.from_pretrained(model_dir)
    shutil.rmtree(model_dir)
    torch.manual_seed(0)
    small = BertModel(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=64))
    small.save_pretrained(model_dir)
    for name in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"]:
        shutil.copy(tokenizer_dir / name, model_dir / name)  # 300 tokens, but only 100 embedding rows
    with pytest.raises(CheckpointError, match="tokenizer has 300 tokens but the model's embedding has 100 rows"):
        SentenceEncoder.from_pretrained(model_dir)


def test_embed_command(tmp_path, minilm_dir):
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("A man is playing a guitar.\nSomeone plays music.\nThe stock market fell.\n")
    out = tmp_path / "vectors.npy"
    run = [sys.executable, "-m", "unmask.cli", "embed", str(minilm_dir), "--input", str(sentences),
           "--output", str(out), "--batch_size", "2"]
    done = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    vectors = np.load(out)
    assert vectors.shape == (3, 384) and np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]  # music is nearer guitar than stocks
    fp32 = vectors
    done = subprocess.run(run + ["--int8"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    int8 = np.load(out)
    assert 0.95 < (int8 * fp32).sum(1).min() and (int8 * fp32).sum(1).max() < 0.9999  # quantised, still close
    done = subprocess.run(run + ["--bf16"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert 0.998 < (np.load(out) * fp32).sum(1).min()  # bfloat16 rounding only
    done = subprocess.run(run + ["--bf16", "--int8"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "not allowed with argument" in done.stderr
    done = subprocess.run(run + ["--no_normalize"], capture_output=True, text=True, timeout=120)
    raw = np.load(out)
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1, atol=1e-3)
    done = subprocess.run(run + ["--dimensions", "128"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    prefix = raw[:, :128] / np.linalg.norm(raw[:, :128], axis=1, keepdims=True)  # the leading 128, renormalised
    assert np.abs(np.load(out) - prefix).max() < 1e-6
    done = subprocess.run(run + ["--dimensions", "500"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "dimensions must be between 1 and the model's 384, got 500" in done.stderr
    sentences.write_text("one\n\nthree\n")
    done = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "sentences.txt:2: empty line" in done.stderr
