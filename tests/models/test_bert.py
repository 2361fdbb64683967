"""BERT against transformers on the same weights: parity both ways, directories both ways, clear errors."""

from __future__ import annotations

import json

import pytest
import torch

from unmask.config import PRESETS, BertConfig, load_config
from unmask.errors import CheckpointError
from unmask.models import set_attn_backend
from unmask.models.bert import BertForMaskedLM, BertForSequenceClassification, BertModel

transformers = pytest.importorskip("transformers")

TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)


def hf_tiny(seed: int = 0):
    torch.manual_seed(seed)
    return transformers.BertForMaskedLM(transformers.BertConfig(**TINY)).eval()


def batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 99, (3, 16), generator=g)
    attention_mask = torch.ones_like(ids)
    attention_mask[1, 10:] = 0
    attention_mask[2, 5:] = 0
    ids[attention_mask == 0] = 0
    token_type_ids = torch.zeros_like(ids)
    token_type_ids[:, 8:] = 1
    labels = torch.full_like(ids, -100)
    labels[0, [2, 7, 12]] = ids[0, [2, 7, 12]]
    labels[1, 3] = ids[1, 3]
    labels[2, 1] = ids[2, 1]
    return ids, attention_mask, token_type_ids, labels


@pytest.mark.parametrize("backend", ["varlen", "sdpa"])
def test_logits_and_loss_match_transformers(backend):
    hf = hf_tiny()
    ours = BertForMaskedLM(BertConfig(**TINY)).eval()
    assert set(ours.state_dict()) == set(hf.state_dict())
    ours.load_state_dict(hf.state_dict(), strict=True)
    set_attn_backend(ours, backend)  # unpadded rows, or every position with a masked SDPA call (ONNX export's)
    ids, mask, types, labels = batch()
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels)
        full = ours(ids, mask, types, labels=labels)
        sparse = ours(ids, mask, types, labels=labels, sparse_prediction=True)
    real = mask.bool()
    # forward computes what transformers computes: (B, T, V) logits and their loss
    assert full.logits.shape == theirs.logits.shape and abs(full.loss.item() - theirs.loss.item()) <= 1e-5
    assert (full.logits[real] - theirs.logits[real]).abs().max() <= 1e-5
    assert abs(sparse.loss.item() - theirs.loss.item()) <= 1e-5
    # sparse logits are the full logits at the labelled positions, in row-major order
    assert sparse.logits.shape == (5, 99)
    assert (sparse.logits - theirs.logits[labels != -100]).abs().max() <= 1e-5


@pytest.mark.parametrize("backend", ["varlen", "sdpa"])
def test_training_path_matches_transformers_loss_and_gradients(backend):
    """In training mode q/k/v run as one stacked GEMM (inference uses three), and the head predicts only at the
    labelled rows: same loss, same gradients. Dropout is off so that the two models see the same numbers."""
    hf = hf_tiny()
    ours = BertForMaskedLM(BertConfig(**TINY, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)).train()
    ours.load_state_dict(hf.state_dict(), strict=True)
    set_attn_backend(ours, backend)
    ids, mask, types, labels = batch()
    hf(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels).loss.backward()
    loss = ours(ids, mask, types, labels=labels, sparse_prediction=True).loss
    loss.backward()
    theirs = dict(hf.named_parameters())
    for name, param in ours.named_parameters():
        assert torch.allclose(param.grad, theirs[name].grad, atol=1e-6, rtol=1e-4), name
    with torch.no_grad():
        ours.eval()
        assert abs(ours(ids, mask, types, labels=labels, sparse_prediction=True).loss.item() - loss.item()) <= 1e-6


def test_rounded_prediction_rows_leave_loss_and_gradients_unchanged():
    """70 labels round up to 72 rows: the 2 unlabelled extra rows (label -100) change nothing."""
    hf = hf_tiny()
    ours = BertForMaskedLM(BertConfig(**TINY)).eval()
    ours.load_state_dict(hf.state_dict(), strict=True)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, 99, (4, 64), generator=g)
    mask = torch.ones_like(ids)
    mask[3, 40:] = 0
    labels = torch.full_like(ids, -100)
    chosen = mask.flatten().nonzero().squeeze(1)[torch.randperm(int(mask.sum()), generator=g)[:70]]
    labels.view(-1)[chosen] = ids.view(-1)[chosen]
    theirs = hf(input_ids=ids, attention_mask=mask, labels=labels)
    theirs.loss.backward()
    out = ours(ids, mask, labels=labels, sparse_prediction=True)
    out.loss.backward()
    assert out.logits.shape == (72, 99) and int(out.predicted_positions.sum()) == 72
    scored = labels[out.predicted_positions] != -100
    assert (out.logits[scored] - theirs.logits[labels != -100]).abs().max() <= 1e-5
    assert abs(out.loss.item() - theirs.loss.item()) <= 1e-6
    hf_grads = dict(hf.named_parameters())
    for name, param in ours.named_parameters():
        assert torch.allclose(param.grad, hf_grads[name].grad, atol=1e-6, rtol=1e-4), name


def test_training_with_dropout_takes_the_same_steps_as_transformers_given_the_same_masks(monkeypatch):
    """Dropout on, as in fine-tuning: every dropout of both models draws its mask in the padded (B, T, ...) layout
    from one shared generator (ours, which drops out only real-token rows, keeps those rows of it). With the same
    masks, the same regression head and the same batches, five AdamW steps must give the same losses and weights:
    this pins down where each dropout sits (embeddings, attention probabilities, both residual branches, pooled
    vector) and its scale, which inference-mode parity cannot see."""
    import math

    import torch.nn.functional as F

    import unmask.models.attention
    import unmask.models.dropout

    state = {}

    def mask(shape, p):
        return (torch.rand(shape, generator=state["generator"]) >= p).float() / (1 - p)

    def shared_dropout(x, p=0.5, training=True, inplace=False):
        if not training or p == 0:
            return x
        B, T = state["shape"]
        if x.dim() >= 3:  # transformers: (B, T, H), padding included; attention probabilities (B, nh, T, T)
            return x * mask(x.shape, p)
        if x.shape[0] == B:  # the pooled (B, H) vector, on both sides
            return x * mask(x.shape, p)
        return x * mask((B * T, x.shape[-1]), p)[state["real"]]  # ours: (N, H) real-token rows

    def shared_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kwargs):
        scores = q @ k.transpose(-1, -2) * (scale or 1 / math.sqrt(q.shape[-1]))  # (B, nh, T, T) on both sides
        if attn_mask is not None:
            scores = (scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool
                      else scores + attn_mask)
        probs = scores.softmax(-1)
        return (probs * mask(probs.shape, dropout_p) if dropout_p > 0 else probs) @ v

    monkeypatch.setattr(F, "dropout", shared_dropout)
    # ours draws its own masks on the CPU, and computes attention with dropout itself
    monkeypatch.setattr(unmask.models.dropout, "dropout", shared_dropout)
    monkeypatch.setattr(unmask.models.attention, "keep_mask",  # (1 = keep; the attention scales by 1 / (1 - p))
                        lambda x, p: mask(x.shape, p) * (1 - p))
    monkeypatch.setattr(F, "scaled_dot_product_attention", shared_sdpa)
    torch.manual_seed(0)
    hf = transformers.BertForSequenceClassification(
        transformers.BertConfig(**TINY, num_labels=1, attn_implementation="sdpa"))
    ours = BertForSequenceClassification(BertConfig(**TINY, num_labels=1))
    ours.load_state_dict(hf.state_dict(), strict=True)
    ids, attention_mask, types, _ = batch()
    targets = torch.tensor([0.2, 0.9, 0.5])
    losses = {}
    for name, model in (("hf", hf), ("ours", ours)):
        model.train()
        state.update(generator=torch.Generator().manual_seed(1), shape=ids.shape,
                     real=attention_mask.flatten().nonzero().flatten())
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses[name] = []
        for _ in range(5):
            loss = model(input_ids=ids, attention_mask=attention_mask, token_type_ids=types, labels=targets).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses[name].append(loss.item())
    assert len(set(losses["hf"])) == 5  # the masks change every step
    assert max(abs(a - b) for a, b in zip(losses["hf"], losses["ours"])) <= 1e-6, losses
    theirs = hf.state_dict()
    for key, value in ours.state_dict().items():
        assert torch.allclose(value, theirs[key], atol=1e-5), key


def test_our_weights_load_into_transformers_strictly():
    torch.manual_seed(1)
    ours = BertForMaskedLM(BertConfig(**TINY)).eval()
    hf = transformers.BertForMaskedLM(transformers.BertConfig(**TINY)).eval()
    hf.load_state_dict(ours.state_dict(), strict=True)
    ids, mask, types, _ = batch(1)
    with torch.no_grad():
        diff = (ours(ids, mask, types).logits - hf(input_ids=ids, attention_mask=mask, token_type_ids=types).logits)
    assert diff[mask.bool()].abs().max() <= 1e-5


def test_saved_directory_loads_in_transformers_and_pipeline(tmp_path, tokenizer):
    torch.manual_seed(2)
    config = BertConfig(**{**TINY, "vocab_size": tokenizer.vocab_size})
    ours = BertForMaskedLM(config).eval()
    ours.save_pretrained(tmp_path, tokenizer=tokenizer)
    assert {p.name for p in tmp_path.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json", "vocab.txt"}
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir()), "no temp files left behind"
    hf = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path)).eval()
    ids, mask, types, _ = batch(2)
    ids = ids % tokenizer.vocab_size
    with torch.no_grad():
        diff = ours(ids, mask, types).logits - hf(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
    assert diff[mask.bool()].abs().max() <= 1e-5
    fill = transformers.pipeline("fill-mask", model=str(tmp_path), top_k=5)
    text = "the old sailor [MASK] the lighthouse"
    theirs = fill(text)
    enc = tokenizer.encode_batch([text])[0]
    position = enc.ids.index(tokenizer.mask_token_id)
    with torch.no_grad():
        probs = ours(torch.tensor([enc.ids])).logits[0, position].softmax(-1)
    top = probs.topk(5)
    assert [r["token"] for r in theirs] == top.indices.tolist()
    assert max(abs(r["score"] - s) for r, s in zip(theirs, top.values.tolist())) < 1e-5
    again = BertForMaskedLM.from_pretrained(tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), ours.state_dict().values()))


def test_minilm_encoder_matches_transformers(minilm_dir):
    ours = BertModel.from_pretrained(minilm_dir)
    hf = transformers.AutoModel.from_pretrained(str(minilm_dir)).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(minilm_dir))
    enc = tok(["A man is playing a guitar.", "Short one."], padding=True, return_tensors="pt")
    with torch.no_grad():
        a = ours(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
        b = hf(**enc)
    real = enc["attention_mask"].bool()
    assert (a.last_hidden_state[real] - b.last_hidden_state[real]).abs().max() <= 1e-5
    assert (a.pooler_output - b.pooler_output).abs().max() <= 1e-5


def test_headless_checkpoint_into_masked_lm_warns_about_new_head(minilm_dir):
    with pytest.warns(UserWarning, match="newly initialised"):
        model = BertForMaskedLM.from_pretrained(minilm_dir)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight


@pytest.mark.parametrize("checkpoint", ["BertModel", "BertForMaskedLM"])  # with a pooler, and without one
def test_a_seed_gives_the_same_new_head_and_random_stream_as_transformers(tmp_path, checkpoint):
    """Loading draws only the new weights from the caller's stream, as transformers does: the encoder's random
    init, overwritten by the checkpoint, must not shift the head's draw or the dropout masks that follow."""
    from unmask import models

    torch.manual_seed(0)
    getattr(transformers, checkpoint)(transformers.BertConfig(**TINY)).save_pretrained(tmp_path)
    torch.manual_seed(3)
    with pytest.warns(UserWarning, match="newly initialised"):
        ours = models.from_pretrained(tmp_path, "sequence-classification", num_labels=3)
    ours_next = torch.rand(4)
    torch.manual_seed(3)
    theirs = transformers.BertForSequenceClassification.from_pretrained(tmp_path, num_labels=3)
    assert torch.equal(torch.rand(4), ours_next)
    for key, value in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value), key


def test_legacy_bin_loads_with_weights_only(tmp_path):
    hf = hf_tiny(3)
    hf.save_pretrained(str(tmp_path), safe_serialization=False) if "safe_serialization" in \
        hf.save_pretrained.__code__.co_varnames else None
    if not (tmp_path / "pytorch_model.bin").exists():
        hf.config.save_pretrained(str(tmp_path))
        torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
    ours = BertForMaskedLM.from_pretrained(tmp_path)
    ids, mask, types, _ = batch(3)
    with torch.no_grad():
        diff = ours(ids, mask, types).logits - hf(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
    assert diff[mask.bool()].abs().max() <= 1e-5


def test_clear_errors_for_bad_checkpoints(tmp_path):
    model = BertForMaskedLM(BertConfig(**TINY))
    good = model.save_pretrained(tmp_path / "good")
    with pytest.raises(CheckpointError, match="model directory not found"):
        BertForMaskedLM.from_pretrained(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="config.json: missing"):
        BertForMaskedLM.from_pretrained(tmp_path / "empty")
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "config.json").write_bytes((good / "config.json").read_bytes())
    (corrupt / "model.safetensors").write_bytes((good / "model.safetensors").read_bytes()[:200])
    with pytest.raises(CheckpointError, match=r"model.safetensors: corrupt"):
        BertForMaskedLM.from_pretrained(corrupt)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))
    with pytest.raises(CheckpointError, match="model_type 'gpt2'"):
        BertForMaskedLM.from_pretrained(foreign)
    wrong_vocab = tmp_path / "wrong_vocab"
    wrong_vocab.mkdir()
    (wrong_vocab / "config.json").write_text(json.dumps({**TINY, "model_type": "bert", "vocab_size": 120}))
    (wrong_vocab / "model.safetensors").write_bytes((good / "model.safetensors").read_bytes())
    with pytest.raises(CheckpointError, match=r"word_embeddings.weight has shape \(99, 32\) but the config asks for "
                                              r"\(120, 32\)"):
        BertForMaskedLM.from_pretrained(wrong_vocab)


def test_clear_errors_for_bad_inputs():
    model = BertForMaskedLM(BertConfig(**{**TINY, "max_position_embeddings": 16})).eval()
    with pytest.raises(ValueError, match="longer than the model's context of 16"):
        model(torch.ones(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="outside the model's vocabulary of 99"):
        model(torch.tensor([[2, 150, 3]]))


def test_presets_have_the_published_sizes():
    sizes = {name: sum(p.numel() for p in BertModel(load_config(name)).parameters()) for name in
             ["bert-tiny", "bert-mini", "bert-small", "bert-medium", "bert-base"]}
    assert abs(sizes["bert-base"] / 1e6 - 109.5) < 0.5  # the published 110M
    assert abs(sizes["bert-tiny"] / 1e6 - 4.4) < 0.1 and abs(sizes["bert-mini"] / 1e6 - 11.2) < 0.2
    assert abs(sizes["bert-small"] / 1e6 - 28.8) < 0.5 and abs(sizes["bert-medium"] / 1e6 - 41.4) < 0.5
    assert PRESETS["bert-large"]["num_attention_heads"] == 16


def test_config_validation_and_round_trip(tmp_path):
    with pytest.raises(ValueError, match="not a multiple of num_attention_heads"):
        BertConfig(hidden_size=100, num_attention_heads=3)
    config = BertConfig(**TINY, id2label={0: "neg", 1: "pos"})
    config.to_json_file(tmp_path / "config.json")
    again = load_config(tmp_path)
    assert again == config and again.label2id == {"neg": 0, "pos": 1}
    hf = transformers.AutoConfig.from_pretrained(str(tmp_path))
    assert hf.hidden_size == 32 and hf.id2label == {0: "neg", 1: "pos"}


def test_sinusoidal_positions_are_one_linear_map_apart():
    """Row p + k of the table is row p times a matrix that depends on k only (what lets attention learn "look k
    tokens ahead" once for every position); init scales it to the config's RMS and touches nothing else."""
    from unmask.models.bert import init_positions_sinusoidal, sinusoidal_table

    table = sinusoidal_table(512, 64).double()  # (P, H): columns (sin, cos) of 32 frequencies
    frequency = 10000.0 ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64)  # (32,)
    for k in (1, 3):
        shift = torch.zeros(64, 64, dtype=torch.float64)  # block-diagonal: a 2x2 rotation by k * frequency
        c, s = torch.cos(k * frequency), torch.sin(k * frequency)
        shift[0::2, 0::2], shift[1::2, 0::2] = torch.diag(c), torch.diag(s)
        shift[0::2, 1::2], shift[1::2, 1::2] = torch.diag(-s), torch.diag(c)
        assert (table[:-k] @ shift - table[k:]).abs().max() < 1e-4  # float32 table: ~1e-5 rounding at p = 511
    model = BertForMaskedLM(BertConfig(**TINY))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    init_positions_sinusoidal(model, 0.02)
    positions = model.bert.embeddings.position_embeddings.weight
    assert abs(positions.pow(2).mean().sqrt().item() - 0.02) < 1e-6
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert changed == {"bert.embeddings.position_embeddings.weight"}


def test_sparse_head_runs_the_last_feed_forward_at_labelled_rows_only():
    """With sparse_prediction, the last layer's attention output and feed-forward see the 5 labelled rows, not all N."""
    ours = BertForMaskedLM(BertConfig(**TINY)).eval()
    ids, mask, types, labels = batch()
    rows_seen = []
    for layer in ours.bert.encoder.layer:
        layer.intermediate.dense.register_forward_hook(lambda m, inputs, out: rows_seen.append(inputs[0].shape[0]))
    with torch.no_grad():
        ours(ids, mask, types, labels=labels, sparse_prediction=True)
    assert rows_seen == [int(mask.sum()), 5]
    labels[1, 12] = 7  # a label on a padding position
    with pytest.raises(ValueError, match="padding"):
        ours(ids, mask, types, labels=labels, sparse_prediction=True)
    with torch.no_grad():  # no labels: logits at every real token, no loss (SPLADE)
        everywhere = ours(ids, mask, types, sparse_prediction=True)
        full = ours(ids, mask, types).logits
    assert everywhere.loss is None and everywhere.predicted_positions.equal(mask.bool())
    assert torch.allclose(everywhere.logits, full[mask.bool()], atol=1e-5)
