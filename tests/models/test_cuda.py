"""Both architectures on a CUDA GPU against transformers on the same weights (skipped where there is none).

The CPU tests pin the math; these pin the GPU paths that only run there: SDPA's CUDA kernels, bf16 autocast,
fused AdamW, and the varlen backend (FlashAttention's kernel where it is installed, SDPA otherwise).
"""

from __future__ import annotations

import pytest
import torch

from unmask.config import BertConfig, ModernBertConfig
from unmask.models.bert import BertForMaskedLM
from unmask.models.modernbert import ModernBertForMaskedLM

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

BERT = dict(vocab_size=999, hidden_size=128, num_hidden_layers=3, num_attention_heads=4, intermediate_size=256)
MODERNBERT = dict(vocab_size=999, hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=192,
                  max_position_embeddings=128, local_attention=16, global_attn_every_n_layers=2, pad_token_id=0,
                  bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)


@pytest.fixture(autouse=True)
def exact_fp32():
    """TF32 would round fp32 products to 10 mantissa bits, on both sides but not identically."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def masked_batch(seed: int = 0, B: int = 4, T: int = 48):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 999, (B, T), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 30:] = 0
    mask[3, 9:] = 0
    ids[mask == 0] = 0
    chosen = (torch.rand(B, T, generator=g) < 0.2) & mask.bool()
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    return ids.cuda(), mask.cuda(), labels.cuda()


def pair(name: str, backend: str | None = None):
    torch.manual_seed(0)
    if name == "bert":
        hf = transformers.BertForMaskedLM(transformers.BertConfig(**BERT, attn_implementation="sdpa"))
        ours = BertForMaskedLM(BertConfig(**BERT))
    else:
        hf = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(**MODERNBERT))
        ours = ModernBertForMaskedLM(ModernBertConfig(**MODERNBERT))
        ours.attn_backend = backend
    ours.load_state_dict(hf.state_dict(), strict=True)
    return hf.cuda(), ours.cuda()


MODELS = [("bert", None), ("modernbert", "sdpa"), ("modernbert", "varlen")]


@pytest.mark.parametrize("name,backend", MODELS)
def test_fp32_loss_and_gradients_match_transformers_on_gpu(name, backend):
    hf, ours = pair(name, backend)
    hf.eval(), ours.eval()  # dropout off: the same function on both sides
    ids, mask, labels = masked_batch()
    theirs = hf(input_ids=ids, attention_mask=mask, labels=labels).loss
    theirs.backward()
    loss = ours(ids, mask, labels=labels).loss
    loss.backward()
    assert abs(loss.item() - theirs.item()) <= 1e-5
    reference = dict(hf.named_parameters())
    for param_name, param in ours.named_parameters():
        if reference[param_name].grad is None:  # a parameter the loss does not reach on their side
            continue
        assert torch.allclose(param.grad, reference[param_name].grad, atol=1e-5, rtol=1e-3), param_name


@pytest.mark.parametrize("name,backend", MODELS)
def test_bf16_autocast_stays_close_to_fp32_on_gpu(name, backend):
    hf, ours = pair(name, backend)
    hf.eval(), ours.eval()
    ids, mask, labels = masked_batch(seed=1)
    with torch.no_grad():
        exact = hf(input_ids=ids, attention_mask=mask, labels=labels).loss.item()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            ours_bf16 = ours(ids, mask, labels=labels).loss.item()
            theirs_bf16 = hf(input_ids=ids, attention_mask=mask, labels=labels).loss.item()
    # bf16 keeps 8 mantissa bits: a loss near ln(999) = 6.9 moves by a few hundredths at most, on both sides
    assert abs(ours_bf16 - exact) <= 0.03
    assert abs(ours_bf16 - theirs_bf16) <= 0.03


@pytest.mark.parametrize("name,backend", MODELS)
def test_training_steps_in_bf16_lower_the_loss_on_gpu(name, backend):
    """Dropout on, bf16 autocast, fused AdamW on CUDA: fitting one batch drives its loss down, without NaN."""
    _, ours = pair(name, backend)
    ours.train()
    optimizer = torch.optim.AdamW(ours.parameters(), lr=1e-3, fused=True)
    ids, mask, labels = masked_batch(seed=2)
    losses = []
    for _ in range(30):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = ours(ids, mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.5 * losses[0]
