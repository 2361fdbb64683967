"""`--extend_vocab`: a checkpoint's vocabulary grown by the pieces a domain corpus needs; old ids and rows kept, new
rows from the old pieces, the table padded to a multiple of 64, the decoder tied, `transformers` reading the result."""

from __future__ import annotations

import random

import pytest
import torch
from safetensors.torch import load_file

from unmask.config import BertConfig
from unmask.errors import UsageError
from unmask.models import from_pretrained
from unmask.models.bert import BertForMaskedLM
from unmask.tokenizer import Tokenizer
from unmask.train.pretrain import PretrainArgs, pretrain
from unmask.train.vocabulary import old_pieces_of

transformers = pytest.importorskip("transformers")

DOMAIN = ["proteinase", "immunoglobulin", "phosphorylation", "mitochondrial", "transcriptional", "glycoprotein",
          "cytokine", "lymphocyte", "antigen", "receptor"]


@pytest.fixture(scope="module")
def domain_file(tmp_path_factory):
    rng = random.Random(0)
    lines = [" ".join(rng.choice(DOMAIN) for _ in range(8)) + " in the old sailor's letter." for _ in range(400)]
    path = tmp_path_factory.mktemp("domain") / "domain.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def start_dir(tmp_path_factory, tokenizer):
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                                       num_attention_heads=2, intermediate_size=64, max_position_embeddings=64))
    return model.save_pretrained(tmp_path_factory.mktemp("start") / "mlm", tokenizer=tokenizer)


def extended_run(start_dir, domain_file, out, **overrides):
    args = dict(train_file=[str(domain_file)], output_dir=str(out), model_name_or_path=str(start_dir),
                extend_vocab=40, max_seq_length=32, per_device_train_batch_size=8, learning_rate=0.0,
                warmup_steps=1, max_steps=2, cache_dir=str(out.parent / "cache"), show_progress=False)
    return pretrain(PretrainArgs(**{**args, **overrides}))


def test_extended_vocabulary_keeps_old_ids_and_rows_and_initialises_new_ones(start_dir, domain_file, tmp_path,
                                                                             capfd):
    out = tmp_path / "run"
    extended_run(start_dir, domain_file, out)
    assert "--extend_vocab added" in capfd.readouterr().err
    old, new = Tokenizer.from_pretrained(start_dir), Tokenizer.from_pretrained(out)
    old_vocab, new_vocab = old.backend.get_vocab(), new.backend.get_vocab()
    assert all(new_vocab[token] == i for token, i in old_vocab.items())  # every old piece keeps its id
    added = sorted((i, t) for t, i in new_vocab.items() if t not in old_vocab)
    assert 0 < len(added) <= 40 and [i for i, _ in added] == list(range(len(old_vocab), len(new_vocab)))
    before, after = load_file(str(start_dir / "model.safetensors")), load_file(str(out / "model.safetensors"))
    table = after["bert.embeddings.word_embeddings.weight"]
    assert table.shape[0] % 64 == 0 and table.shape[0] >= len(new_vocab)
    assert torch.equal(table[: len(old_vocab)], before["bert.embeddings.word_embeddings.weight"])
    assert not any(k.endswith("decoder.weight") for k in after)  # tied to the table
    for i, piece in added[:5]:
        parts = old_pieces_of(old, piece)
        assert torch.allclose(table[i], before["bert.embeddings.word_embeddings.weight"][parts].mean(0))
    model = from_pretrained(out, "masked-lm")
    assert model.config.vocab_size == table.shape[0]
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight


def test_the_extended_tokenizer_is_shorter_on_the_domain_and_transformers_reads_it(start_dir, domain_file,
                                                                                   tmp_path):
    out = tmp_path / "run"
    extended_run(start_dir, domain_file, out)
    old, new = Tokenizer.from_pretrained(start_dir), Tokenizer.from_pretrained(out)
    texts = domain_file.read_text().splitlines()[:50]
    words = sum(len(t.split()) for t in texts)
    old_tokens = sum(len(e.ids) - 2 for e in old.encode_batch(texts))
    new_tokens = sum(len(e.ids) - 2 for e in new.encode_batch(texts))
    assert new_tokens / words < 0.7 * old_tokens / words
    hf = transformers.AutoTokenizer.from_pretrained(str(out))
    for text in texts[:20] + ["an unbelievable storm over the lighthouse", "Cytokine receptor, again!"]:
        assert hf(text)["input_ids"] == new.encode(text)


def test_extend_vocab_needs_a_checkpoint_and_the_mlm_objective(start_dir, domain_file, tmp_path):
    with pytest.raises(UsageError, match="needs --model_name_or_path"):
        PretrainArgs(train_file=[str(domain_file)], output_dir=str(tmp_path), extend_vocab=10)
    with pytest.raises(UsageError, match="the mlm objective"):
        PretrainArgs(train_file=[str(domain_file)], output_dir=str(tmp_path), extend_vocab=10,
                     model_name_or_path=str(start_dir), objective="electra")
