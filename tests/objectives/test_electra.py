"""ELECTRA: generator sizing, shared embeddings, replaced-token targets, the loss, and pretraining end to end
(export loadable by transformers and by fine-tuning, identical weights after resuming)."""

from __future__ import annotations

import json
import random

import pytest
import torch

from unmask.config import BertConfig, ModernBertConfig, load_config
from unmask.models.outputs import IGNORE_INDEX
from unmask.objectives.electra import EXTRA_WEIGHTS, ElectraPretrainer, generator_config
from unmask.train.pretrain import PretrainArgs, pretrain

TINY = dict(vocab_size=120, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            max_position_embeddings=64)


def test_generator_config_scales_width_not_depth():
    base = load_config("bert-mini")
    small = generator_config(base, 0.25)
    assert (small.hidden_size, small.num_attention_heads, small.intermediate_size) == (
        base.hidden_size // 4, base.num_attention_heads // 4, base.intermediate_size // 4)
    assert small.num_hidden_layers == base.num_hidden_layers
    half = generator_config(load_config("bert-base"), 0.5)
    assert (half.hidden_size, half.num_attention_heads) == (384, 6)
    with pytest.raises(ValueError, match="generator_size"):
        generator_config(base, 0.0)


def batch(vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (3, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    ids[mask == 0] = 0
    labels = torch.full_like(ids, IGNORE_INDEX)
    chosen = (torch.rand(ids.shape, generator=g) < 0.3) & mask.bool()
    labels[chosen] = ids[chosen]
    masked_ids = ids.clone()
    masked_ids[chosen] = 4  # [MASK]
    return masked_ids, mask, labels


def test_embeddings_are_shared_and_trained_by_both_losses():
    torch.manual_seed(0)
    model = ElectraPretrainer(BertConfig(**TINY), generator_size=0.5)
    words = model.discriminator.embeddings.word_embeddings.weight
    names = [n for n, p in model.named_parameters() if p is words]
    assert names == ["discriminator.embeddings.word_embeddings.weight"]  # one parameter, one owner
    assert model.generator.config.hidden_size == 32
    ids, mask, labels = batch(TINY["vocab_size"])
    out = model(ids, mask, labels=labels)
    out.mlm_loss.requires_grad_(False)
    # the generator's loss alone reaches the shared word embeddings (through its input and its output layer)
    generator_only = torch.autograd.grad(
        model.generator_predictions(model.generator(ids, mask).last_hidden_state[labels != IGNORE_INDEX]).sum(),
        words)[0]
    assert generator_only.abs().sum() > 0
    assert torch.allclose(out.loss, out.mlm_loss + 50.0 * out.rtd_loss)


def test_replaced_targets_follow_the_samples():
    torch.manual_seed(0)
    model = ElectraPretrainer(BertConfig(**TINY), generator_size=0.25).eval()
    ids, mask, labels = batch(TINY["vocab_size"], seed=1)
    masked = labels != IGNORE_INDEX
    with torch.no_grad():
        model.generator_predictions.bias.fill_(-1e4)
        model.generator_predictions.bias[7] = 1e4  # the generator now always proposes token 7
        out = model(ids, mask, labels=labels)
    original = torch.where(masked, labels, ids)
    assert torch.equal(out.replaced, masked & (original != 7))  # a right guess counts as original
    assert not out.replaced[~mask.bool()].any()
    rows = out.generator_positions
    assert rows[masked].all() and out.rtd_logits.shape == ids.shape
    assert out.generator_logits.shape == (int(rows.sum()), TINY["vocab_size"])


@pytest.mark.parametrize("backend", ["sdpa", "varlen"])
def test_modernbert_electra_trains(backend):
    torch.manual_seed(0)
    config = ModernBertConfig(vocab_size=120, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                              intermediate_size=96, max_position_embeddings=64, local_attention=8,
                              global_attn_every_n_layers=3, pad_token_id=0)
    model = ElectraPretrainer(config, generator_size=0.5)
    model.discriminator.attn_backend = model.generator.attn_backend = backend
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ids, mask, labels = batch(120, seed=2)
    losses = []
    for _ in range(15):
        out = model(ids, mask, labels=labels)
        losses.append(float(out.loss))
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert losses[-1] < losses[0] * 0.7, losses


@pytest.fixture(scope="module")
def electra_run(tmp_path_factory, corpus_lines, tokenizer_dir):
    root = tmp_path_factory.mktemp("electra")
    # eight sentences, one document each: learnable in seconds (a packed stream of random sentences keeps a model
    # this small at unigram accuracy for hundreds of steps, MLM and ELECTRA alike)
    rng = random.Random(0)
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": rng.choice(corpus_lines[:8])}) + "\n" for _ in range(400)))
    (root / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2,
                                                  "num_attention_heads": 4, "intermediate_size": 128,
                                                  "max_position_embeddings": 64}))

    def run(name: str, **overrides) -> tuple:
        args = dict(train_file=[str(corpus)], validation_file=[str(corpus)], output_dir=str(root / name),
                    model_config=str(root / "config.json"), tokenizer=str(tokenizer_dir), objective="electra",
                    generator_size=0.25, max_seq_length=32, per_device_train_batch_size=8, learning_rate=2e-3,
                    warmup_steps=5, max_steps=160, logging_steps=10, eval_steps=80, max_eval_samples=64,
                    cache_dir=str(root / "cache"), show_progress=False)
        return pretrain(PretrainArgs(**{**args, **overrides})), root / name

    return run


def test_electra_pretraining_learns_and_exports_a_plain_encoder(electra_run):
    transformers = pytest.importorskip("transformers")
    from unmask.models.bert import BertModel
    from unmask.train.finetune import load_head_model

    result, out = electra_run("run")
    evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "eval_rtd_loss" in line]
    assert len(evals) == 2
    # the detector beats the 'nothing was replaced' baseline (~0.86 accuracy here, recall 0): it finds replacements
    assert result["eval_rtd_recall"] > 0.3 and result["eval_rtd_accuracy"] > 0.9, result
    # and keeps learning, to well under the no-skill loss (~0.40 nats: the binary entropy of a ~14% replaced share).
    # Between steps 80 and 160, over seeds 0-4 and 42 in two checkouts: 0.13-0.33 -> 0.07-0.14;
    # one full-suite run gave 0.130 -> 0.107 (the figures move with the process's earlier work and the summation
    # order over 160 steps at lr 2e-3, so the bounds are loose)
    assert evals[1]["eval_rtd_loss"] < min(evals[0]["eval_rtd_loss"], 0.2), evals
    # unigram guessing scores ~0.05; at 120 steps the quarter-size generator sat at 0.095-0.10, on the threshold
    # (measured), so the run is 160 steps (0.24)
    assert result["eval_generator_accuracy"] > 0.1, result
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "bert" and config["architectures"] == ["BertModel"]
    assert (out / EXTRA_WEIGHTS).exists()
    ours = BertModel.from_pretrained(out).eval()
    hf = transformers.AutoModel.from_pretrained(str(out)).eval()
    ids = torch.tensor([[2, 40, 41, 42, 3, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])
    with torch.no_grad():
        diff = ours(ids, mask).last_hidden_state - hf(input_ids=ids, attention_mask=mask).last_hidden_state
    assert diff[:, :5].abs().max() < 1e-5
    classifier = load_head_model("classify", str(out), num_labels=2)  # fine-tuning starts from it
    assert torch.equal(classifier.bert.embeddings.word_embeddings.weight, ours.embeddings.word_embeddings.weight)


def test_electra_resume_gives_identical_weights(electra_run):
    """Resuming restores the generator, the detection head and the sampling RNG, not only the exported encoder."""
    straight = electra_run("straight", max_steps=12, validation_file=[], save_steps=6)[1]
    resumed = electra_run("resumed", max_steps=12, validation_file=[], save_steps=6,
                          resume_from_checkpoint=str(straight / "checkpoint-6"))[1]
    for name in ("model.safetensors", EXTRA_WEIGHTS):
        assert (straight / name).read_bytes() == (resumed / name).read_bytes(), name


def test_modernbert_electra_pretraining_exports_what_transformers_loads(electra_run, tmp_path):
    """Either architecture: a ModernBERT discriminator trained on the unpadded backend, exported as a plain
    ModernBertModel directory."""
    transformers = pytest.importorskip("transformers")
    from unmask.models.modernbert import ModernBertModel

    config = tmp_path / "modernbert.json"
    config.write_text(json.dumps({"model_type": "modernbert", "hidden_size": 64, "num_hidden_layers": 3,
                                  "num_attention_heads": 4, "intermediate_size": 96, "max_position_embeddings": 64,
                                  "local_attention": 8, "global_attn_every_n_layers": 3}))
    result, out = electra_run("modern", model_config=str(config), attn_backend="varlen", max_steps=20, eval_steps=10)
    assert result["eval_rtd_loss"] < 1.0 and 0 <= result["eval_rtd_accuracy"] <= 1
    assert json.loads((out / "config.json").read_text())["architectures"] == ["ModernBertModel"]
    ours = ModernBertModel.from_pretrained(out).eval()
    hf = transformers.AutoModel.from_pretrained(str(out)).eval()
    ids = torch.tensor([[2, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 3]])
    with torch.no_grad():
        diff = ours(ids).last_hidden_state - hf(input_ids=ids).last_hidden_state
    assert diff.abs().max() < 1e-4
