"""ModernBERT against transformers on the same weights; our two attention backends against each other."""

from __future__ import annotations

import pytest
import torch

from unmask.config import PRESETS, ModernBertConfig, load_config
from unmask.errors import CheckpointError
from unmask.models import from_pretrained
from unmask.models.bert import BertForMaskedLM
from unmask.models.modernbert import (
    ModernBertForMaskedLM,
    ModernBertForSequenceClassification,
    ModernBertForTokenClassification,
    ModernBertModel,
)
from unmask.models.padding import pad_input, positions_in_sequence, unpad_input

transformers = pytest.importorskip("transformers")

# ids below the tiny vocabulary (the defaults are ~50k); a short window so sliding layers matter at 24 tokens
TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=48,
            max_position_embeddings=64, local_attention=8, global_attn_every_n_layers=2, pad_token_id=0,
            bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)


def batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 99, (3, 24), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 15:] = 0
    mask[2, 6:] = 0
    ids[mask == 0] = 0
    return ids, mask


def hf_model(cls_name: str, **extra):
    torch.manual_seed(0)
    return getattr(transformers, cls_name)(transformers.ModernBertConfig(**TINY, **extra)).eval()


@pytest.mark.parametrize("backend", ["sdpa", "varlen"])
def test_masked_lm_matches_transformers(backend):
    hf = hf_model("ModernBertForMaskedLM")
    ours = ModernBertForMaskedLM(ModernBertConfig(**TINY)).eval()
    assert set(ours.state_dict()) == set(hf.state_dict())
    ours.load_state_dict(hf.state_dict(), strict=True)
    ours.attn_backend = backend
    ids, mask = batch()
    labels = torch.full_like(ids, -100)
    labels[0, [3, 20]] = ids[0, [3, 20]]
    labels[1, 9] = ids[1, 9]
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=mask, labels=labels)
        full = ours(ids, mask, labels=labels)
        sparse = ours(ids, mask, labels=labels, sparse_prediction=True)
    real = mask.bool()
    assert full.logits.shape == theirs.logits.shape and abs(full.loss.item() - theirs.loss.item()) <= 1e-4
    assert (full.logits[real] - theirs.logits[real]).abs().max() <= 1e-4
    assert abs(sparse.loss.item() - theirs.loss.item()) <= 1e-4


def test_heads_match_transformers():
    for ours_cls, hf_name, extra in [(ModernBertForSequenceClassification, "ModernBertForSequenceClassification",
                                      {"num_labels": 3}),
                                     (ModernBertForSequenceClassification, "ModernBertForSequenceClassification",
                                      {"num_labels": 2, "classifier_pooling": "mean"}),
                                     (ModernBertForTokenClassification, "ModernBertForTokenClassification",
                                      {"num_labels": 5})]:
        hf = hf_model(hf_name, **extra)
        ours = ours_cls(ModernBertConfig(**TINY, **extra)).eval()
        ours.load_state_dict(hf.state_dict(), strict=True)
        ids, mask = batch(1)
        with torch.no_grad():
            a, b = ours(ids, mask).logits, hf(input_ids=ids, attention_mask=mask).logits
        if a.dim() == 3:
            a, b = a[mask.bool()], b[mask.bool()]
        assert (a - b).abs().max() <= 1e-4, hf_name


def test_saved_directory_loads_in_transformers(tmp_path):
    torch.manual_seed(3)
    ours = ModernBertForMaskedLM(ModernBertConfig(**TINY)).eval()
    ours.save_pretrained(tmp_path)
    hf = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path)).eval()
    assert type(hf).__name__ == "ModernBertForMaskedLM"
    assert hf.config.layer_types == ours.config.layer_types and hf.config.local_attention == 8
    ids, mask = batch(2)
    with torch.no_grad():
        diff = ours(ids, mask).logits - hf(input_ids=ids, attention_mask=mask).logits
    assert diff[mask.bool()].abs().max() <= 1e-4
    again = from_pretrained(tmp_path, "masked-lm")
    assert isinstance(again, ModernBertForMaskedLM) and again.config.layer_types == ours.config.layer_types
    with pytest.raises(CheckpointError, match="a modernbert model cannot be loaded as BertForMaskedLM"):
        BertForMaskedLM.from_pretrained(tmp_path)


def test_backends_agree_forward_and_backward():
    torch.manual_seed(4)
    model = ModernBertForMaskedLM(ModernBertConfig(**TINY)).train()  # no dropout by default: deterministic
    ids, mask = batch(3)
    labels = torch.where(torch.rand(ids.shape, generator=torch.Generator().manual_seed(0)) < 0.3, ids, -100)
    labels[mask == 0] = -100
    results = {}
    for backend in ["sdpa", "varlen"]:
        model.zero_grad()
        model.attn_backend = backend
        out = model(ids, mask, labels=labels, sparse_prediction=True)
        out.loss.backward()
        results[backend] = (out.loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()})
    assert abs(results["sdpa"][0] - results["varlen"][0]) < 1e-5
    worst = max((results["sdpa"][1][n] - results["varlen"][1][n]).abs().max().item() for n in results["sdpa"][1])
    assert worst < 1e-5, worst


def test_default_backend_runs_on_real_tokens_only():
    """A loaded model skips the padding: the feed-forward sees the 45 real tokens of the batch, not its 3 x 24 rows
    (the padded backend computes them all), and both give the same hidden states at the real tokens."""
    model = ModernBertModel(ModernBertConfig(**TINY)).eval()
    assert model.attn_backend == "varlen"
    ids, mask = batch()
    rows = []
    model.layers[0].mlp.Wi.register_forward_hook(lambda module, args, out: rows.append(args[0].shape[:-1]))
    with torch.no_grad():
        unpadded = model(ids, mask).last_hidden_state
        model.attn_backend = "sdpa"
        padded = model(ids, mask).last_hidden_state
    assert rows == [torch.Size([45]), torch.Size([3, 24])]
    assert (unpadded[mask.bool()] - padded[mask.bool()]).abs().max() < 1e-5


@pytest.mark.parametrize("backend", ["sdpa", "varlen"])
def test_sliding_window_is_local(backend):
    """On a sliding layer a token sees +-local_attention/2 tokens; a change farther away reaches it only through
    global layers. With every layer local (an explicit layer_types: by the global_attn_every_n_layers rule layer 0
    is always global), it cannot reach it at all."""
    config = ModernBertConfig(**{**TINY, "num_hidden_layers": 2, "layer_types": ["sliding_attention"] * 2})
    torch.manual_seed(5)
    model = ModernBertModel(config).eval()
    model.attn_backend = backend
    ids = torch.randint(3, 99, (1, 32), generator=torch.Generator().manual_seed(1))
    changed = ids.clone()
    changed[0, 31] = 5
    with torch.no_grad():
        a, b = model(ids).last_hidden_state, model(changed).last_hidden_state
    # two local layers with a half-window of 4: position 31 reaches back at most to 23
    assert torch.equal(a[0, :23], b[0, :23]) and not torch.equal(a[0, 23:], b[0, 23:])
    # the default pattern makes layer 0 global: the change then reaches every position
    global_first = ModernBertModel(ModernBertConfig(**{**TINY, "num_hidden_layers": 2,
                                                       "global_attn_every_n_layers": 1000})).eval()
    with torch.no_grad():
        diff = global_first(ids).last_hidden_state - global_first(changed).last_hidden_state
    assert (diff[0, :23].abs().amax(-1) > 0).all()


def test_unpad_pad_round_trip_and_offsets():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    indices, cu_seqlens, max_seqlen, padded_positions, padded_real = unpad_input(mask)
    assert indices.tolist() == [0, 1, 2, 4, 5] and cu_seqlens.tolist() == [0, 3, 5] and max_seqlen == 3
    assert padded_positions.tolist() == [0, 1, 2, 3, 4]  # in the (2, 3) batch the longest sequence needs
    assert padded_real.tolist() == [[True, True, True], [True, True, False]]
    assert unpad_input(torch.ones(2, 3)).padded_positions is None  # nothing to pad back: attention takes a view
    assert positions_in_sequence(cu_seqlens).tolist() == [0, 1, 2, 0, 1]
    x = torch.arange(8.0).view(2, 4, 1)
    assert torch.equal(pad_input(x.view(8, 1)[indices], indices, 2, 4), x * mask[..., None])


def test_presets():
    base = load_config("modernbert-base")
    assert (base.num_hidden_layers, base.hidden_size, base.intermediate_size, base.num_attention_heads) == \
        (22, 768, 1152, 12)
    params = sum(p.numel() for p in ModernBertModel(base).parameters())
    assert abs(params / 1e6 - 149) < 1.0  # the published 149M (tied embeddings counted once)
    assert set(PRESETS) >= {"modernbert-tiny", "modernbert-mini", "modernbert-small", "modernbert-base"}


@pytest.mark.parametrize("T,window", [(70, 16), (129, 32), (300, 128)])
def test_blocked_sliding_window_equals_the_dense_band(T, window):
    """The linear-memory kernel (query blocks against nearby keys) gives the dense masked result, gradients too."""
    from unmask.models.attention import padded_mask, sdpa, sliding_window_sdpa

    torch.manual_seed(T)
    q, k, v = (torch.randn(2, 3, T, 8, requires_grad=True) for _ in range(3))
    mask = torch.ones(2, T, dtype=torch.long)
    mask[1, T - 20:] = 0
    real = mask.bool()[:, None, :, None].expand(2, 3, T, 8)
    blocked = sliding_window_sdpa(q, k, v, window, mask)
    dense = sdpa(q, k, v, padded_mask(mask, T, window, q.device))
    assert (blocked - dense)[real].abs().max() < 1e-5
    grads = []
    for out in (blocked, dense):
        for t in (q, k, v):
            t.grad = None
        out[real].sum().backward()
        grads.append([t.grad.clone() for t in (q, k, v)])
    assert all((a - b).abs().max() < 1e-5 and not a.isnan().any() for a, b in zip(*grads))
