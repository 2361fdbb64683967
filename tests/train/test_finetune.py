"""Fine-tuning end to end on small synthetic tasks, label alignment, truncation, exports that transformers reads."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from unmask.config import BertConfig
from unmask.data.labelled import (
    _truncate,
    align,
    build_label_map,
    encode_texts,
    tag_label_map,
)
from unmask.errors import DataError, UsageError
from unmask.models.bert import (
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)
from unmask.pipelines.embed import SentenceEncoder
from unmask.pipelines.tag import predict_entities
from unmask.tokenizer import load_tokenizer
from unmask.train.finetune import FinetuneArgs, finetune

transformers = pytest.importorskip("transformers")

POSITIVE = ["celebrated", "painted", "discovered", "remembered", "photographed"]
NEGATIVE = ["abandoned", "misunderstood", "broke", "lost", "forgot"]
NAMES = ["Alice", "Bruno", "Chen", "Dmitri", "Esther"]
PLACES = [["Lisbon"], ["New", "York"], ["Osaka"], ["Cape", "Town"]]


def tiny_config(tokenizer, hidden_size: int = 64, dropout: float = 0.0) -> BertConfig:
    """A two-layer BERT over the test tokenizer (context 64)."""
    return BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=hidden_size, num_hidden_layers=2,
                      num_attention_heads=2, intermediate_size=2 * hidden_size, max_position_embeddings=64,
                      hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory, tokenizer):
    """A small random encoder with its tokenizer: what `unmask pretrain` leaves behind, in miniature."""
    torch.manual_seed(0)
    config = tiny_config(tokenizer)
    path = tmp_path_factory.mktemp("encoder")
    BertModel(config).save_pretrained(path, tokenizer=tokenizer)
    return path


def sentiment_rows(n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        positive = rng.random() < 0.5
        verb = rng.choice(POSITIVE if positive else NEGATIVE)
        rows.append((f"the old sailor {verb} the lighthouse by the harbour", "pos" if positive else "neg"))
    return rows


def write_tsv(path, rows):
    path.write_text("sentence\tlabel\n" + "".join(f"{t}\t{l}\n" for t, l in rows))
    return path


def test_classify_end_to_end_and_transformers_reads_the_result(tmp_path, encoder_dir):
    train = write_tsv(tmp_path / "train.tsv", sentiment_rows(400, 0))
    valid = write_tsv(tmp_path / "valid.tsv", sentiment_rows(100, 1))
    out = tmp_path / "clf"
    result = finetune(FinetuneArgs(task="classify", model=str(encoder_dir), train_file=str(train),
                                   validation_file=str(valid), output_dir=str(out), learning_rate=2e-3,
                                   num_train_epochs=4, per_device_train_batch_size=16, max_seq_length=32,
                                   show_progress=False))
    assert result["eval_accuracy"] >= 0.95, result
    assert 0 < result["eval_macro_f1"] <= 1 and result["best_step"] % 25 == 0  # evaluated once per epoch (25 steps)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len([r for r in rows if "eval_accuracy" in r]) == 4
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(str(out)).eval()
    assert hf.config.id2label == {0: "neg", 1: "pos"}
    ours = BertForSequenceClassification.from_pretrained(out)
    text = "the old sailor celebrated the lighthouse by the harbour"
    pipe = transformers.pipeline("text-classification", model=str(out))
    assert pipe(text)[0]["label"] == "pos"
    enc = transformers.AutoTokenizer.from_pretrained(str(out))([text], return_tensors="pt")
    with torch.no_grad():
        assert (ours(**enc).logits - hf(**enc).logits).abs().max() < 1e-5
    done = subprocess.run([sys.executable, "-m", "unmask.cli", "predict", "classify", "--model", str(out), text],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)[0]["label"] == "pos"
    done = subprocess.run([sys.executable, "-m", "unmask.cli", "eval", "classify", "--model", str(out), "--file",
                           str(valid), "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["accuracy"] == result["eval_accuracy"]
    check_long_input_classification(ours.eval(), out, text)


def check_long_input_classification(model, out, text):
    """A text past the 64-position context: windows whose logits are averaged (chunk), a warning (truncate), or a
    clear error."""
    from unmask.data.windows import make_windows
    from unmask.pipelines.classify import predict_classify

    tokenizer = load_tokenizer(out)
    long_text = " ".join([text] * 8)
    enc = tokenizer.encode_batch([long_text])[0]
    windows = make_windows([(enc.ids, enc.type_ids)], 64, stride=16)
    n_content = len(enc.ids) - 2
    assert len(windows) == 1 + -(-(n_content - 62) // (62 - 16)) >= 2  # windows of 62 content tokens, 16 shared
    with torch.no_grad():
        logits = torch.stack([model(torch.tensor([ids])).logits[0] for ids in windows.input_ids]).mean(0)
    [[chunked]] = predict_classify(model, tokenizer, [long_text], stride=16)
    expected = logits.softmax(-1)
    assert chunked["label"] == model.config.id2label[int(expected.argmax())]
    assert abs(chunked["score"] - float(expected.max())) < 1e-5
    with pytest.raises(ValueError, match="longer than the context of 64"):
        predict_classify(model, tokenizer, [long_text], truncation="error")
    with pytest.warns(UserWarning, match="1 of 1 inputs were longer than the context of 64"):
        predict_classify(model, tokenizer, [long_text], truncation="truncate")


def test_early_stopping_keeps_the_best_epoch(tmp_path, encoder_dir):
    train = write_tsv(tmp_path / "train.tsv", sentiment_rows(64, 2))
    valid = write_tsv(tmp_path / "valid.tsv", sentiment_rows(64, 3))
    result = finetune(FinetuneArgs(task="classify", model=str(encoder_dir), train_file=str(train),
                                   validation_file=str(valid), output_dir=str(tmp_path / "es"), learning_rate=1e-6,
                                   num_train_epochs=20, per_device_train_batch_size=16, early_stopping_patience=2,
                                   show_progress=False))
    assert result["stopped_by"] == "early stopping" and result["step"] < 20 * 4


def conll_sentences(n: int, seed: int) -> list[list[tuple[str, str]]]:
    rng = random.Random(seed)
    sentences = []
    for _ in range(n):
        place = rng.choice(PLACES)
        words = [("yesterday", "O"), (rng.choice(NAMES), "B-PER"), ("travelled", "O"), ("to", "O")]
        words += [(w, ("B-LOC" if i == 0 else "I-LOC")) for i, w in enumerate(place)]
        words += [("with", "O"), (rng.choice(NAMES), "B-PER"), (".", "O")]
        sentences.append(words)
    return sentences


def write_conll(path, sentences):
    lines = ["-DOCSTART- -X- -X- O", ""]
    for sentence in sentences:
        lines += [f"{w} NN B-NP {t}" for w, t in sentence] + [""]
    path.write_text("\n".join(lines))
    return path


def test_label_alignment_first_piece(tokenizer):
    words = ["Unbelievable", "storm", "reorganised", "Lisbon"]
    tags = ["O", "O", "B-MISC", "B-LOC"]
    label2id = tag_label_map([tags])
    assert label2id == {"O": 0, "B-LOC": 1, "B-MISC": 2}
    data = align(tokenizer, [words], [tags], label2id, max_length=64)
    enc = tokenizer.encode_batch([words], is_pretokenized=True)[0]
    assert len(set(enc.word_ids[1:-1])) < len(enc.ids) - 2, "some word must have several pieces"
    expected = []
    previous = None
    for w in enc.word_ids:
        expected.append(-100 if w is None or w == previous else label2id[tags[w]])
        previous = w
    assert data.labels[0] == expected
    assert data.labels[0][0] == -100 and data.labels[0][-1] == -100
    assert [enc.word_ids[p] for p in data.first_piece[0]] == [0, 1, 2, 3]


def test_tag_end_to_end(tmp_path, encoder_dir):
    train = write_conll(tmp_path / "train.txt", conll_sentences(300, 0))
    valid = write_conll(tmp_path / "valid.txt", conll_sentences(60, 1))
    out = tmp_path / "ner"
    result = finetune(FinetuneArgs(task="tag", model=str(encoder_dir), train_file=str(train),
                                   validation_file=str(valid), output_dir=str(out), learning_rate=3e-3,
                                   num_train_epochs=4, per_device_train_batch_size=16, max_seq_length=48,
                                   show_progress=False))
    assert result["eval_f1"] >= 0.95, result
    hf = transformers.AutoModelForTokenClassification.from_pretrained(str(out)).eval()
    ours = BertForTokenClassification.from_pretrained(out)
    ids = torch.tensor([[2, 10, 11, 12, 3]])
    with torch.no_grad():
        assert (ours(ids).logits - hf(ids).logits).abs().max() < 1e-5
    done = subprocess.run([sys.executable, "-m", "unmask.cli", "predict", "tag", "--model", str(out),
                           "yesterday Alice travelled to New York with Chen ."],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert [(e["entity_group"], e["word"], e["start"], e["end"]) for e in found] == [
        ("PER", "Alice", 10, 15), ("LOC", "New York", 29, 37), ("PER", "Chen", 43, 47)]
    # six times over (~80 tokens, past the 64-position context): read in windows, entities found in place over the
    # whole text. The model never saw sentences run together nor positions past ~15, so a few entities are missed or
    # added there, and how many moves with the last bits of the float arithmetic (5 extra in one install, 4 in
    # another): the bounds are recall >= 0.8 and precision >= 2/3, not an exact count.
    sentence = "yesterday Alice travelled to New York with Chen ."
    long_text = " ".join([sentence] * 6)
    found = predict_entities(ours.eval(), load_tokenizer(out), [long_text], stride=16)[0]
    expected = [(kind, word, k * (len(sentence) + 1) + start, k * (len(sentence) + 1) + end) for k in range(6)
                for kind, word, start, end in [("PER", "Alice", 10, 15), ("LOC", "New York", 29, 37),
                                               ("PER", "Chen", 43, 47)]]
    found = [(e["entity_group"], e["word"], e["start"], e["end"]) for e in found]
    assert all(long_text[start:end] == word for _, word, start, end in found)  # offsets into the whole text
    right = len(set(expected) & set(found))
    assert right >= 0.8 * len(expected) and right >= 2 / 3 * len(found), found
    assert {e for e in expected if e[2] >= 250} & set(found)  # the last copy, past the first window, was read
    with pytest.raises(ValueError, match="longer than the context of 64"):
        predict_entities(ours, load_tokenizer(out), [long_text], truncation="error")
    with pytest.warns(UserWarning, match="truncated"):
        cut = predict_entities(ours, load_tokenizer(out), [long_text], truncation="truncate")[0]
    cut = [(e["entity_group"], e["word"], e["start"], e["end"]) for e in cut]
    assert 3 <= len(cut) < len(expected) and cut[:3] == expected[:3], cut  # the first window only


def test_pair_truncation_matches_transformers(tokenizer_dir, tokenizer):
    hf = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
    a = "the old sailor remembered the lighthouse by the harbour before dawn and after dusk"
    b = "a letter"
    c = "the children painted seventeen wooden chairs"
    for first, second in [(a, b), (b, a), (a, c), (c, a), (c, c)]:  # longer first, second, equal
        for max_length in [7, 8, 9, 12, 16, 40]:
            ids, types, _ = encode_texts(tokenizer, [first], [second], max_length)
            theirs = hf(first, second, truncation=True, max_length=max_length)
            assert ids[0] == theirs["input_ids"] and types[0] == theirs["token_type_ids"], (first, second, max_length)
    single = tokenizer.encode_batch([a])[0]
    assert _truncate(single.ids, single.type_ids, 6)[0] == hf(a, truncation=True, max_length=6)["input_ids"]


def test_clear_errors(tmp_path, encoder_dir):
    train = write_tsv(tmp_path / "train.tsv", sentiment_rows(20, 0))
    valid = write_tsv(tmp_path / "valid.tsv", [("the sailor painted", "neutral")])
    args = dict(task="classify", model=str(encoder_dir), train_file=str(train), output_dir=str(tmp_path / "o"),
                show_progress=False)
    with pytest.raises(DataError, match="label 'neutral', which the model does not know"):
        finetune(FinetuneArgs(**args, validation_file=str(valid)))
    with pytest.raises(DataError, match="no column 'text'"):
        finetune(FinetuneArgs(**{**args, "text_column": "text"}))
    empty = tmp_path / "empty.tsv"
    empty.write_text("sentence\tlabel\n")
    with pytest.raises(DataError, match="no examples"):
        finetune(FinetuneArgs(**{**args, "train_file": str(empty)}))
    assert build_label_map(["10", "9", "1"]) == {"1": 0, "9": 1, "10": 2}


def sts_rows(n: int, seed: int) -> list[tuple[str, str, float]]:
    """Pairs scored 5 when both verbs share a polarity, 0 otherwise."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        first, second = rng.choice(POSITIVE + NEGATIVE), rng.choice(POSITIVE + NEGATIVE)
        score = 5.0 if (first in POSITIVE) == (second in POSITIVE) else 0.0
        rows.append((f"the sailor {first} the letter", f"a doctor {second} the road", score))
    return rows


def write_sts(path, rows):
    path.write_text("".join(f"g\tf\t2012\t{i:04d}\t{s}\t{a}\t{b}\n" for i, (a, b, s) in enumerate(rows)))
    return path


def test_a_new_run_refuses_an_output_dir_another_run_left(tmp_path, encoder_dir):
    """As transformers' scripts: its checkpoints would be taken for the new run's (resume, rotation)."""
    out = tmp_path / "o"
    (out / "checkpoint-99").mkdir(parents=True)
    args = dict(task="classify", model=str(encoder_dir), train_file=str(write_tsv(tmp_path / "t.tsv",
                sentiment_rows(20, 0))), output_dir=str(out), max_steps=2, show_progress=False)
    with pytest.raises(UsageError, match="is not empty .checkpoint-99.: pass --overwrite_output_dir"):
        finetune(FinetuneArgs(**args))
    finetune(FinetuneArgs(**args, overwrite_output_dir=True))
    assert not (out / "checkpoint-99").exists() and (out / "model.safetensors").is_file()


def test_pair_regression_on_sts_format(tmp_path, encoder_dir):
    train = write_sts(tmp_path / "sts-train.csv", sts_rows(300, 0))
    valid = write_sts(tmp_path / "sts-dev.csv", sts_rows(80, 1))
    with pytest.raises(DataError, match="add --regression"):
        finetune(FinetuneArgs(task="pair", model=str(encoder_dir), train_file=str(train),
                              output_dir=str(tmp_path / "x"), show_progress=False))
    out = tmp_path / "cross"
    result = finetune(FinetuneArgs(task="pair", model=str(encoder_dir), train_file=str(train),
                                   validation_file=str(valid), output_dir=str(out), regression=True, label_scale=5,
                                   learning_rate=1e-3, num_train_epochs=20, per_device_train_batch_size=16,
                                   show_progress=False))
    # Same polarity or not is an XOR across the two segments, which the tiny random encoder learns in ~20 epochs (2 s).
    # With 0/5 labels, perfect separation scores 0.862 (ties); over seeds 0-9 under AVX2, AVX-512 and SSE kernels
    # (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA) the worst run reached 0.780 (it fell to 0.79 at lr 2e-3 on CI's CPU).
    assert result["eval_spearman"] > 0.7, result
    done = subprocess.run([sys.executable, "-m", "unmask.cli", "predict", "rerank", "--model", str(out),
                           "the sailor celebrated the letter", "a doctor forgot the road",
                           "a doctor painted the road"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    ranked = json.loads(done.stdout)
    assert [r["index"] for r in ranked] == [1, 0] and ranked[0]["score"] > ranked[1]["score"]


def test_embed_cosent_improves_sts(tmp_path, encoder_dir):
    from unmask.data.readers import read_sts
    from unmask.train.evaluate import evaluate_sts

    train = write_sts(tmp_path / "sts-train.csv", sts_rows(300, 2))
    valid = write_sts(tmp_path / "sts-dev.csv", sts_rows(80, 3))
    before = evaluate_sts(SentenceEncoder.from_pretrained(encoder_dir), *read_sts(valid))["spearman"]
    out = tmp_path / "bi"
    result = finetune(FinetuneArgs(task="embed", model=str(encoder_dir), train_file=str(train),
                                   validation_file=str(valid), output_dir=str(out), learning_rate=1e-3,
                                   num_train_epochs=3, per_device_train_batch_size=16, show_progress=False))
    assert result["eval_spearman"] > max(before + 0.3, 0.7), (before, result)
    st = pytest.importorskip("sentence_transformers")
    again = SentenceEncoder.from_pretrained(out)
    sentences = ["the sailor painted the letter", "a doctor lost the road"]
    theirs = st.SentenceTransformer(str(out), device="cpu").encode(sentences, convert_to_numpy=True)
    assert abs(again.encode(sentences) - theirs).max() < 1e-5


def test_embed_in_batch_negatives_on_unscored_pairs(tmp_path, encoder_dir):
    pairs = tmp_path / "pairs.jsonl"
    rng = random.Random(4)
    lines = []
    for _ in range(200):
        verb = rng.choice(POSITIVE + NEGATIVE)
        name = rng.choice(NAMES)
        pair = {"sentence1": f"{name} {verb} the letter", "sentence2": f"the letter {verb} by {name}"}
        lines.append(json.dumps(pair))
    pairs.write_text("\n".join(lines) + "\n")
    result = finetune(FinetuneArgs(task="embed", model=str(encoder_dir), train_file=str(pairs),
                                   output_dir=str(tmp_path / "mnrl"), learning_rate=1e-3, num_train_epochs=2,
                                   per_device_train_batch_size=16, logging_steps=5, show_progress=False))
    rows = [json.loads(line) for line in (tmp_path / "mnrl" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["loss"] < rows[0]["loss"] * 0.7, rows
    assert (tmp_path / "mnrl" / "modules.json").exists() and result["step"] == 26


def _triplets(path, seed: int = 5) -> list[dict]:
    """(anchor, positive, negative) rows: the positive names the anchor verb's partner (an arbitrary pairing to
    learn), the hard negative another verb, the anchor's own verb included; nothing else tells them apart."""
    rng, verbs = random.Random(seed), POSITIVE + NEGATIVE
    partner = {verb: verbs[(i + 3) % len(verbs)] for i, verb in enumerate(verbs)}
    rows = []
    for _ in range(240):
        verb, name = rng.choice(verbs), rng.choice(NAMES)
        other = rng.choice([v for v in verbs if v != partner[verb]])
        rows.append({"anchor": f"{name} {verb} the letter", "positive": f"the letter {partner[verb]} by {name}",
                     "negative": f"the letter {other} by {name}"})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return rows


def _ranked_right(model_dir, rows, dimensions=None) -> float:
    """How often an anchor is nearer its positive than its hard negative."""
    encoder = SentenceEncoder.from_pretrained(model_dir)
    a, p, n = (encoder.encode([r[c] for r in rows], normalize=True, dimensions=dimensions)
               for c in ("anchor", "positive", "negative"))
    return float(((a * p).sum(1) > (a * n).sum(1)).mean())


def test_embed_learns_from_hard_negatives_in_triplets(tmp_path, encoder_dir):
    """After training on the triplets, each anchor is nearer its positive than its hard negative far more often."""
    triplets = tmp_path / "triplets.jsonl"
    rows = _triplets(triplets)
    before = _ranked_right(encoder_dir, rows)
    finetune(FinetuneArgs(task="embed", model=str(encoder_dir), train_file=str(triplets),
                          output_dir=str(tmp_path / "hard"), learning_rate=1e-3, num_train_epochs=3,
                          per_device_train_batch_size=16, show_progress=False, seed=0))
    after = _ranked_right(tmp_path / "hard", rows)  # 0.92-0.96 from 0.40-0.51 over four data and training seeds
    assert after >= 0.85 and after > before + 0.3, (before, after)


def test_matryoshka_dims_make_the_leading_dimensions_rank(tmp_path, encoder_dir):
    """Trained with --matryoshka_dims 64,16,8,4, the first 4 dimensions alone rank the triplets far better than
    those of a model trained at full width only (by 0.067-0.092 over three seeds, 0.875-0.908 against 0.81-0.83)."""
    triplets = tmp_path / "triplets.jsonl"
    rows = _triplets(triplets, seed=0)
    common = dict(task="embed", model=str(encoder_dir), train_file=str(triplets), learning_rate=1e-3,
                  num_train_epochs=3, per_device_train_batch_size=16, show_progress=False, seed=0)
    finetune(FinetuneArgs(output_dir=str(tmp_path / "plain"), **common))
    finetune(FinetuneArgs(output_dir=str(tmp_path / "nested"), matryoshka_dims="64,16,8,4", **common))
    plain, nested = (_ranked_right(tmp_path / name, rows, dimensions=4) for name in ("plain", "nested"))
    assert nested >= 0.85 and nested >= plain + 0.04, (plain, nested)
    assert _ranked_right(tmp_path / "nested", rows) >= 0.85  # the full vector still ranks


def test_embed_trains_on_a_beir_training_set_and_names_its_faults(tmp_path, encoder_dir):
    from unmask.example_data import write_example_data

    write_example_data(tmp_path / "data")
    beir = {name: str(tmp_path / "data" / "scifact" / file) for name, file in
            (("corpus", "corpus.jsonl"), ("queries", "queries.train.jsonl"), ("qrels", "qrels/train.tsv"))}
    result = finetune(FinetuneArgs(task="embed", model=str(encoder_dir), output_dir=str(tmp_path / "beir"),
                                   learning_rate=1e-3, num_train_epochs=2, per_device_train_batch_size=16,
                                   max_seq_length=64, logging_steps=1, show_progress=False, **beir))
    rows = [json.loads(line) for line in (tmp_path / "beir" / "metrics.jsonl").read_text().splitlines()]
    assert result["step"] == 10 and rows[-1]["loss"] < rows[0]["loss"]  # 67 judged pairs, 16 a step, 2 epochs
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\n0\t1000\t1\n999\t1000\t1\n")
    with pytest.raises(DataError, match=r"qrels.tsv:3: query '999' is not in .*queries.train.jsonl"):
        finetune(FinetuneArgs(task="embed", model=str(encoder_dir), output_dir=str(tmp_path / "bad"),
                              show_progress=False, **{**beir, "qrels": str(qrels)}))
    with pytest.raises(UsageError, match="--corpus, --queries and --qrels together"):
        FinetuneArgs(task="embed", model=str(encoder_dir), output_dir="x", corpus=beir["corpus"])


def test_pair_trains_a_reranker_on_triplets(tmp_path, encoder_dir):
    """finetune pair reads an (anchor, positive, negative...) file as a ranking task: a one-label cross-encoder
    (sentence-transformers' CrossEncoder shape) whose positive should outscore the negatives. Here relevance shows in
    the document alone (a verb of one list or the other): it is learned. Resumed from its checkpoint mid-way, the
    run ends with the same weights."""
    rng = random.Random(0)
    rows = [{"anchor": f"{name} wrote the letter", "positive": f"the letter {rng.choice(POSITIVE)} by {name}",
             "negative_1": f"the letter {rng.choice(NEGATIVE)} by {name}",
             "negative_2": f"the letter {rng.choice(NEGATIVE)} by {rng.choice(NAMES)}"}
            for name in (rng.choice(NAMES) for _ in range(120))]
    triplets = tmp_path / "triplets.jsonl"
    triplets.write_text("".join(json.dumps(row) + "\n" for row in rows))
    common = dict(task="pair", model=str(encoder_dir), train_file=str(triplets), validation_file=str(triplets),
                  learning_rate=2e-3, num_train_epochs=4, per_device_train_batch_size=16, max_seq_length=64,
                  show_progress=False)
    result = finetune(FinetuneArgs(output_dir=str(tmp_path / "rerank"), save_steps=15, **common))
    config = json.loads((tmp_path / "rerank" / "config.json").read_text())
    assert config["num_labels"] == 1 and result["eval_examples"] == 120
    assert result["eval_accuracy"] >= 0.9 and result["eval_mrr"] > 0.9, result  # 1.0 over four seeds
    resumed = tmp_path / "resumed"
    shutil.copytree(tmp_path / "rerank" / "checkpoint-15", resumed / "checkpoint-15")
    finetune(FinetuneArgs(output_dir=str(resumed), resume_from_checkpoint="latest", **common))
    first, second = (load_file(str(d / "model.safetensors")) for d in (tmp_path / "rerank", resumed))
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_a_label_only_in_the_training_file_is_refused_unless_listed(tmp_path, encoder_dir):
    """A stray header line inside the training file ("label") would make a third class: refused, named; --labels
    lists the classes, and then that row is the error."""
    train = write_tsv(tmp_path / "train.tsv", sentiment_rows(40, 0) + [("sentence", "label")])
    valid = write_tsv(tmp_path / "valid.tsv", sentiment_rows(20, 1))
    common = dict(task="classify", model=str(encoder_dir), train_file=str(train), validation_file=str(valid),
                  output_dir=str(tmp_path / "out"), num_train_epochs=1, show_progress=False)
    with pytest.raises(DataError, match=r"label\(s\) 'label' occur in the training file but never in .*valid.tsv, "
                                        r"so the model would get 3 classes"):
        finetune(FinetuneArgs(**common))
    with pytest.raises(DataError, match=r"row 41 has label 'label', which the model does not know"):
        finetune(FinetuneArgs(labels="neg,pos", **common))
    write_tsv(train, sentiment_rows(40, 0))
    result = finetune(FinetuneArgs(labels="pos,neg,neutral", **common))  # a class the data lacks, on purpose
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["id2label"] == {"0": "pos", "1": "neg", "2": "neutral"} and result["step"] >= 1


def test_max_train_and_eval_samples_take_the_first_examples(tmp_path, encoder_dir):
    train = write_tsv(tmp_path / "train.tsv", sentiment_rows(100, 0))
    valid = write_tsv(tmp_path / "valid.tsv", sentiment_rows(50, 1))
    result = finetune(FinetuneArgs(task="classify", model=str(encoder_dir), train_file=str(train),
                                   validation_file=str(valid), output_dir=str(tmp_path / "few"), num_train_epochs=1,
                                   per_device_train_batch_size=8, max_seq_length=32, max_train_samples=24,
                                   max_eval_samples=7, show_progress=False))
    assert result["step"] == 3 and result["eval_examples"] == 7  # 24 examples at 8 a step; 7 evaluated


def test_gradient_caching_gives_the_uncached_gradients(tmp_path, encoder_dir, tokenizer):
    """--mini_batch_tokens: the same loss and the same gradient on every weight (1e-5), from mini-batches of a
    few rows each."""
    from unmask.data.labelled import LabelledFormat, load_pairs
    from unmask.train.finetune import BiEncoder
    from unmask.train.gradcache import token_chunks

    triplets = tmp_path / "triplets.jsonl"
    _triplets(triplets)
    batch = load_pairs(LabelledFormat(task="embed", max_seq_length=64), tokenizer, str(triplets)).collate(
        list(range(24)), tokenizer.pad_token_id)
    assert len(token_chunks(batch["attention_mask"], 40)) >= 6  # 24 anchors of ~7 tokens: 5 rows a mini-batch
    results = []
    for budget in (None, 40):
        model = BiEncoder(SentenceEncoder.from_pretrained(encoder_dir), matryoshka_dims=[64, 16],
                          mini_batch_tokens=budget).train()
        loss = model(**batch).loss
        loss.backward()
        results.append((loss.item(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (plain_loss, plain), (cached_loss, cached) = results
    assert cached_loss == pytest.approx(plain_loss, abs=1e-6) and plain.keys() == cached.keys() and len(plain) > 10
    for name, grad in plain.items():
        assert torch.allclose(cached[name], grad, atol=1e-5, rtol=1e-4), name


def test_a_cached_run_trains_as_the_uncached_one(tmp_path, encoder_dir):
    triplets = tmp_path / "triplets.jsonl"
    _triplets(triplets)
    common = dict(task="embed", model=str(encoder_dir), train_file=str(triplets), learning_rate=1e-3,
                  num_train_epochs=1, per_device_train_batch_size=48, logging_steps=1, show_progress=False)
    for name, budget in (("plain", None), ("cached", 64)):
        finetune(FinetuneArgs(output_dir=str(tmp_path / name), mini_batch_tokens=budget, **common))
    plain, cached = ([json.loads(line)["loss"] for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
                     for name in ("plain", "cached"))
    assert len(plain) == 5 and cached == pytest.approx(plain, abs=1e-4)


@pytest.fixture(scope="module")
def reranker_rows(tmp_path_factory, encoder_dir):
    """(rows, a cross-encoder trained on them): relevance shows in the document's verb (one list or the other)."""
    rng = random.Random(0)
    rows = [{"anchor": f"{name} wrote the letter", "positive": f"the letter {rng.choice(POSITIVE)} by {name}",
             "negative": f"the letter {rng.choice(NEGATIVE)} by {rng.choice(NAMES)}"}
            for name in (rng.choice(NAMES) for _ in range(120))]
    root = tmp_path_factory.mktemp("teacher")
    (root / "triplets.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    finetune(FinetuneArgs(task="pair", model=str(encoder_dir), train_file=str(root / "triplets.jsonl"),
                          output_dir=str(root / "reranker"), learning_rate=2e-3, num_train_epochs=4,
                          per_device_train_batch_size=16, max_seq_length=64, show_progress=False))
    return rows, root


def test_a_teacher_scores_the_tuples_as_transformers_does_and_its_loss_is_added(reranker_rows, encoder_dir,
                                                                              tokenizer):
    """--teacher: each (anchor, candidate) gets the cross-encoder's log-odds (finetune pair's one-label reranker:
    transformers' logit on the same weights), and the loss is the ranking loss plus MarginMSE (or KL) on 20 x cosine."""
    from unmask.data.labelled import LabelledFormat, load_pairs
    from unmask.objectives.contrastive import (
        candidate_scores,
        duplicate_positives,
        kl_distillation_loss,
        margin_mse_loss,
        multiple_negatives_ranking_loss,
        text_keys,
    )
    from unmask.train.finetune import BiEncoder, cross_encoder_scorer

    rows, root = reranker_rows
    data = load_pairs(LabelledFormat(task="embed", max_seq_length=64), tokenizer, str(root / "triplets.jsonl"),
                      cross_encoder_scorer(str(root / "reranker"), 32))
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(root / "reranker").eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(root / "reranker")
    for i in (0, 7):
        inputs = hf_tokenizer([rows[i]["anchor"]] * 2, [rows[i]["positive"], rows[i]["negative"]],
                              return_tensors="pt", padding=True)
        with torch.no_grad():
            logits = reference(**inputs).logits
        assert data.teacher_scores[i] == pytest.approx(logits[:, 0].tolist(), abs=1e-4)
    assert sum(s[0] > s[1] for s in data.teacher_scores) >= 110  # the teacher knows the task
    batch = data.collate(list(range(16)), tokenizer.pad_token_id)
    for distillation, loss_fn in (("margin_mse", margin_mse_loss), ("kl", kl_distillation_loss)):
        model = BiEncoder(SentenceEncoder.from_pretrained(encoder_dir), distillation=distillation).eval()
        a = model.embed(batch["input_ids"], batch["attention_mask"])
        ids, mask = (batch[k].transpose(0, 1).reshape(32, -1) for k in ("input_ids_b", "attention_mask_b"))
        c = model.embed(ids, mask)
        expected = (multiple_negatives_ranking_loss(a, c, duplicate_positives(text_keys(ids, mask), torch.arange(16)))
                    + loss_fn(candidate_scores(a, c.view(2, 16, -1).transpose(0, 1)), batch["teacher_scores"]))
        assert model(**batch).loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_distilling_the_teacher_trains_and_a_wrong_teacher_is_named(tmp_path, reranker_rows, encoder_dir):
    rows, root = reranker_rows
    common = dict(task="embed", model=str(encoder_dir), train_file=str(root / "triplets.jsonl"), learning_rate=1e-3,
                  num_train_epochs=2, per_device_train_batch_size=16, logging_steps=1, show_progress=False)
    finetune(FinetuneArgs(output_dir=str(tmp_path / "kl"), teacher=str(root / "reranker"), distillation="kl",
                          **common))
    losses = [json.loads(line)["loss"] for line in (tmp_path / "kl" / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 16 and sum(losses[-4:]) < 0.7 * sum(losses[:4]), losses
    wrong = r"--teacher needs a sequence classifier, and .* holds an encoder without a task head"
    with pytest.raises(UsageError, match=wrong):
        finetune(FinetuneArgs(output_dir=str(tmp_path / "x"), teacher=str(encoder_dir), **common))
    with pytest.raises(UsageError, match="--distillation must be one of margin_mse, kl"):
        FinetuneArgs(output_dir="x", distillation="mse", **common)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
def test_two_processes_rank_against_every_ranks_candidates_as_one_process(tmp_path, encoder_dir):
    """Under torchrun each rank's anchors rank against all ranks' candidates (repeated positives masked across
    ranks, the symmetric term over all anchors): 2 processes x 8 rows take the steps of one process with 16, with
    gradient caching too (its gradients averaged by hand: DDP cannot hook its replayed backward)."""
    triplets = tmp_path / "triplets.jsonl"
    _triplets(triplets)
    common = ["finetune", "embed", "--model", str(encoder_dir), "--train_file", str(triplets), "--max_steps", "3",
              "--learning_rate", "1e-3", "--logging_steps", "1", "--max_seq_length", "64", "--symmetric"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29547",
                "-m", "unmask.cli"]
    runs = {"one": [sys.executable, "-m", "unmask.cli", *common, "--per_device_train_batch_size", "16"],
            "two": [*torchrun, *common, "--per_device_train_batch_size", "8"],
            "two_cached": [*torchrun, *common, "--per_device_train_batch_size", "8", "--mini_batch_tokens", "40"]}
    for name, command in runs.items():
        done = subprocess.run([*command, "--output_dir", str(tmp_path / name)], capture_output=True, text=True,
                              timeout=300, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
    weights = {name: load_file(str(tmp_path / name / "model.safetensors")) for name in runs}
    losses = {name: [json.loads(line)["loss"] for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
              for name in runs}
    for name in ("two", "two_cached"):
        assert losses[name] == pytest.approx(losses["one"], abs=1e-5) and len(losses[name]) == 3
        worst = max((weights[name][k] - weights["one"][k]).abs().max().item() for k in weights["one"])
        assert worst < 1e-5, (name, worst)  # the same update; only the order of floating-point sums differs


def test_finetune_sparse_learns_splade_vectors_and_flops_keeps_them_sparse(tmp_path, tokenizer):
    """finetune sparse from a masked-LM: anchors come nearer their positives than their hard negatives by the
    SPLADE dot product; FLOPS regularisation leaves fewer non-zero weights; the result is a masked-LM directory."""
    from unmask import models
    from unmask.models.bert import BertForMaskedLM
    from unmask.pipelines.sparse import sparse_encode

    torch.manual_seed(0)
    config = tiny_config(tokenizer)
    BertForMaskedLM(config).save_pretrained(tmp_path / "mlm", tokenizer=tokenizer)
    triplets = tmp_path / "triplets.jsonl"
    rows = _triplets(triplets)

    def ranked_right(path) -> tuple[float, float]:
        model = models.from_pretrained(path, "masked-lm").eval()
        a, p, n = (sparse_encode(model, tokenizer, [r[c] for r in rows]) for c in ("anchor", "positive", "negative"))
        right = np.mean((a.dense() * p.dense()).sum(axis=1) > (a.dense() * n.dense()).sum(axis=1))
        return float(right), len(p.values) / len(p)

    common = dict(task="sparse", model=str(tmp_path / "mlm"), train_file=str(triplets), learning_rate=3e-3,
                  num_train_epochs=4, per_device_train_batch_size=16, max_seq_length=64, show_progress=False, seed=0)
    finetune(FinetuneArgs(output_dir=str(tmp_path / "free"), query_regularizer_weight=0.0,
                          document_regularizer_weight=0.0, **common))
    finetune(FinetuneArgs(output_dir=str(tmp_path / "flops"), query_regularizer_weight=1e-2,
                          document_regularizer_weight=1e-2, **common))
    (before, _), (free, free_size), (_, flops_size) = (
        ranked_right(tmp_path / name) for name in ("mlm", "free", "flops"))
    assert free >= 0.8 and free > before + 0.3, (before, free)  # 0.95-0.96 from 0.47 over seeds 0-2
    assert flops_size < 0.7 * free_size, (free_size, flops_size)  # 0.46-0.51 over seeds 0-2
    assert json.loads((tmp_path / "free" / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    encoder_only = tmp_path / "encoder_only"
    BertModel(config).save_pretrained(encoder_only, tokenizer=tokenizer)
    with pytest.raises(UsageError, match="finetune sparse needs a masked-LM, and .* holds an encoder without"):
        finetune(FinetuneArgs(**{**common, "model": str(encoder_only), "output_dir": str(tmp_path / "x")}))


def test_gradient_caching_replays_the_embeddings_it_scored_under_dropout(tmp_path, tokenizer):
    """With dropout, each mini-batch's replay (with gradients) computes exactly the vectors its first pass (without)
    gave the loss: the same random state and the same kernels, so the gradient is the scored loss's. The candidates'
    last mini-batch keeps its graph and is computed once."""
    from unmask.data.labelled import LabelledFormat, load_pairs
    from unmask.train.finetune import BiEncoder

    torch.manual_seed(0)
    config = tiny_config(tokenizer, hidden_size=32, dropout=0.1)
    BertModel(config).save_pretrained(tmp_path / "dropout", tokenizer=tokenizer)
    triplets = tmp_path / "triplets.jsonl"
    _triplets(triplets)
    batch = load_pairs(LabelledFormat(task="embed", max_seq_length=64), tokenizer, str(triplets)).collate(
        list(range(12)), tokenizer.pad_token_id)
    model = BiEncoder(SentenceEncoder.from_pretrained(tmp_path / "dropout"), mini_batch_tokens=40).train()
    seen, embed = [], model.embed

    def recorded(input_ids, attention_mask):
        out = embed(input_ids, attention_mask)
        seen.append((torch.is_grad_enabled(), out.detach().clone()))
        return out

    model.embed = recorded
    model(**batch).loss.backward()
    first = [v for grad, v in seen if not grad]
    with_graph = [v for grad, v in seen if grad]
    assert len(with_graph) == len(first) + 1 and len(first) >= 3  # the replays, and the kept last mini-batch
    for vectors in first:
        assert sum(v.shape == vectors.shape and torch.allclose(v, vectors, atol=1e-6) for v in with_graph) == 1
