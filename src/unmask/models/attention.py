"""Attention kernels as functions, chosen at run time; none owns parameters, so switching never changes a model.

    sdpa    padded (B, nh, T, hd) tensors, a boolean mask (padding, and the band for sliding-window layers);
            torch's scaled_dot_product_attention, runs everywhere
    varlen  unpadded (N, nh, hd) tensors with cu_seqlens: FlashAttention's varlen kernel where it is installed and
            the tensors are on a GPU, one SDPA call per sequence in inference on the CPU, otherwise one padded
            SDPA call (the projections around attention, nearly all of the FLOPs, run on real tokens only)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from unmask.errors import UsageError
from unmask.models.dropout import keep_mask
from unmask.models.padding import Unpadded, pad_input

try:  # optional, GPU only
    from flash_attn import flash_attn_varlen_func
except ImportError:  # pragma: no cover - depends on the machine
    flash_attn_varlen_func = None


BACKENDS = ("sdpa", "varlen")


def set_attn_backend(model: torch.nn.Module, backend: str) -> None:
    """The attention backend of every encoder in `model` (ELECTRA holds two): varlen (unpadded rows) or sdpa (padded,
    as transformers); a run-time choice that changes no parameter. The encoders hold it as their own attribute
    (their heads only pass it through), which is how they are found here, below the model classes."""
    if backend not in BACKENDS:
        raise UsageError(f"attn_backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    for module in model.modules():
        if "attn_backend" in vars(module):
            module.attn_backend = backend


def band_mask(T: int, window: int | None, device) -> torch.Tensor | None:
    """(T, T) True where |i - j| <= window // 2 (a sliding window of `window` tokens); None for global layers."""
    if window is None:
        return None
    idx = torch.arange(T, device=device)
    return (idx[None, :] - idx[:, None]).abs() <= window // 2


def padded_mask(attention_mask: torch.Tensor | None, T: int, window: int | None, device) -> torch.Tensor | None:
    """(B, 1, T or 1, T) boolean mask combining key padding and the sliding-window band; None if nothing masks.
    `attention_mask` (B, T), 1 = real token; pass None when nothing is padded (SDPA is faster without a mask)."""
    band = band_mask(T, window, device)
    keys = None if attention_mask is None else attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T)
    if band is None:
        return keys
    return band[None, None] if keys is None else keys & band[None, None]


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
         dropout_p: float = 0.0) -> torch.Tensor:
    """(B, nh, T, hd) each -> (B, nh, T, hd). `mask` True where a query may attend to a key."""
    if dropout_p > 0.0 and q.device.type == "cpu":
        return attention_with_dropout(q, k, v, mask, dropout_p)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)


def attention_with_dropout(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                           dropout_p: float) -> torch.Tensor:
    """softmax(q k^T / sqrt(hd)) with dropout on the probabilities, times v, written out: on the CPU no fused SDPA
    kernel takes dropout, so SDPA would run this same math, upcasting bf16 inputs to fp32 and drawing its mask with
    `bernoulli_`. Here the products stay in the autocast dtype (as `transformers`' eager attention) and the mask is
    `dropout.dropout`'s, which halves the attention's time in a bf16 training step (BENCHMARKS.md).

    For the backward only q, k, v and the dropout mask are kept; the probabilities are recomputed there (as
    FlashAttention does): autograd would keep two (B, nh, T, T) tensors a layer, the largest activations of a step."""
    return _AttentionWithDropout.apply(q, k, v, mask, dropout_p)


def _probabilities(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """softmax(q k^T / sqrt(hd)) where `mask` allows, (B, nh, T, T). Each pass over a (B, nh, T, T) tensor costs
    T / hd times one over q, so the scale goes on q and the mask is filled in place."""
    scores = torch.matmul(q * q.shape[-1] ** -0.5, k.transpose(-1, -2))  # (B, nh, T, T)
    if mask is not None:  # the lowest finite score, not -inf: a padding query with no key in its window gets
        scores.masked_fill_(~mask, torch.finfo(scores.dtype).min)  # a finite (unused) row, not NaN
    return scores.softmax(-1)


class _AttentionWithDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, dropout_p):
        probabilities = _probabilities(q, k, mask)
        keep = keep_mask(probabilities, dropout_p)
        ctx.save_for_backward(q, k, v, keep, mask)
        ctx.dropout_p, ctx.autocast = dropout_p, torch.is_autocast_enabled("cpu")
        # dropout's 1 / (1 - p) on the (B, nh, T, hd) output rather than the (B, nh, T, T) probabilities
        return torch.matmul(probabilities.mul_(keep), v).mul_(1.0 / (1.0 - dropout_p))

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, keep, mask = ctx.saved_tensors
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=ctx.autocast):  # the forward's arithmetic again
            probabilities = _probabilities(q, k, mask)
        grad_out = grad_out.to(probabilities.dtype) * (1.0 / (1.0 - ctx.dropout_p))  # dropout's scale, (B, nh, T, hd)
        grad_p = torch.matmul(grad_out, v.to(grad_out.dtype).transpose(-1, -2)).mul_(keep)
        # softmax's backward, p * (g - sum_j g_j p_j), in one pass
        grad_scores = torch._softmax_backward_data(grad_p, probabilities, -1, probabilities.dtype).to(q.dtype)
        del grad_p
        grad_v = torch.matmul(probabilities.mul_(keep).transpose(-1, -2), grad_out)  # the forward's dropped p
        del probabilities
        scale = q.shape[-1] ** -0.5  # the score scale, on the (B, nh, T, hd) side again
        grad_q = torch.matmul(grad_scores, k).mul_(scale)
        grad_k = torch.matmul(grad_scores.transpose(-1, -2), q).mul_(scale)
        return grad_q, grad_k, grad_v.to(v.dtype), None, None


def sliding_window_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int,
                        attention_mask: torch.Tensor | None = None, dropout_p: float = 0.0) -> torch.Tensor:
    """Attention within |i - j| <= window // 2 in time and memory linear in T: queries in blocks of `window`
    tokens, each block against the 2 x `window` keys around it. (B, nh, T, hd) each -> (B, nh, T, hd).

    `attention_mask` (B, T), 1 = real token. Rows of padding queries may attend anywhere in their block, so no
    row is empty (an empty row would give NaN, and NaN gradients)."""
    B, nh, T, hd = q.shape
    half, block = window // 2, window
    n_blocks = -(-T // block)
    tail = n_blocks * block - T
    qb = F.pad(q, (0, 0, 0, tail)).view(B, nh, n_blocks, block, hd)
    span = block + 2 * half  # the keys a block of queries can see
    kb, vb = (F.pad(t, (0, 0, half, tail + half)).unfold(2, span, block).transpose(-1, -2) for t in (k, v))
    # (B, nh, n_blocks, span, hd): key b of block n sits at absolute position n * block - half + b
    key_pos = torch.arange(n_blocks, device=q.device)[:, None] * block - half + torch.arange(span, device=q.device)
    key_ok = (key_pos >= 0) & (key_pos < T)  # (n_blocks, span)
    key_ok = key_ok[None].expand(B, -1, -1)
    if attention_mask is not None:
        real = F.pad(attention_mask.bool(), (half, tail + half)).unfold(1, span, block)  # (B, n_blocks, span)
        key_ok = key_ok & real
    a = torch.arange(block, device=q.device)[:, None]
    b = torch.arange(span, device=q.device)[None, :]
    band = (b - a >= 0) & (b - a <= 2 * half)  # |query - key| <= half in block coordinates
    mask = band[None, None] & key_ok[:, :, None, :]  # (B, n_blocks, block, span)
    query_real = torch.arange(n_blocks * block, device=q.device) < T
    if attention_mask is not None:
        query_real = query_real & F.pad(attention_mask.bool(), (0, tail))
    mask = mask | ~query_real.view(-1 if attention_mask is not None else 1, n_blocks, block)[..., None]
    out = sdpa(qb, kb, vb, mask[:, None], dropout_p)  # (B, nh, n_blocks, block, hd)
    return out.reshape(B, nh, n_blocks * block, hd)[:, :, :T]


def varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: Unpadded, window: int | None = None,
           dropout_p: float = 0.0) -> torch.Tensor:
    """(N, nh, hd) each, sequences laid out by `batch` (`unpad_input`) -> (N, nh, hd); no token attends across
    sequences."""
    if flash_attn_varlen_func is not None and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
        half = window // 2 if window is not None else -1
        return flash_attn_varlen_func(q, k, v, batch.cu_seqlens, batch.cu_seqlens, batch.max_seqlen,
                                      batch.max_seqlen, dropout_p=dropout_p, window_size=(half, half))
    N, nh, hd = q.shape
    B, T = len(batch.cu_seqlens) - 1, batch.max_seqlen
    if batch.padded_positions is None:  # nothing is padded (packed pretraining): a view, and SDPA without a mask
        q, k, v = (t.view(B, T, nh, hd).transpose(1, 2) for t in (q, k, v))
        return local_or_global(q, k, v, window, None, dropout_p).transpose(1, 2).reshape(N, nh, hd)
    if q.device.type == "cpu" and not torch.is_grad_enabled() and dropout_p == 0.0:
        # inference; not a no-grad pass in training, whose dropout must draw as the pass with gradients does
        # (gradient caching replays its mini-batches with the same random state)
        return _each_sequence(q, k, v, batch, window, dropout_p)
    # back to a right-padded batch for one SDPA call (in training on the CPU too: autograd over one slice per
    # sequence costs more than the padding saves; BENCHMARKS.md)
    where = batch.padded_positions
    q, k, v = (pad_input(t, where, B, T).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hd)
    y = local_or_global(q, k, v, window, batch.padded_real, dropout_p)  # (B, nh, T, hd)
    return y.transpose(1, 2).reshape(B * T, nh, hd)[where]


def _each_sequence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: Unpadded, window: int | None,
                   dropout_p: float) -> torch.Tensor:
    """Inference on the CPU: one SDPA call per sequence, on views of the unpadded rows, with no mask. Padding the
    batch for one call costs three scatters and a gather a layer, and SDPA's CPU kernel then computes the padded
    rows too: on ragged batches this is the faster path (BENCHMARKS.md)."""
    out = torch.empty_like(q)  # (N, nh, hd)
    starts = batch.cu_seqlens.tolist()
    for a, b in zip(starts[:-1], starts[1:]):
        if a == b:  # an all-padding row has no tokens to attend from
            continue
        q1, k1, v1 = (t[a:b].transpose(0, 1)[None] for t in (q, k, v))  # (1, nh, L, hd)
        out[a:b] = local_or_global(q1, k1, v1, window, None, dropout_p)[0].transpose(0, 1)
    return out


def local_or_global(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None,
                    attention_mask: torch.Tensor | None, dropout_p: float = 0.0) -> torch.Tensor:
    """Padded attention for one layer: global, or sliding-window (blocked once T exceeds two windows, where the
    dense band would cost more than the blocks; a trace for ONNX export keeps the dense band, which exports for
    every T). (B, nh, T, hd) each -> (B, nh, T, hd)."""
    T = q.shape[2]
    if window is not None and T > 2 * window and not torch.jit.is_tracing():
        return sliding_window_sdpa(q, k, v, window, attention_mask, dropout_p)
    return sdpa(q, k, v, padded_mask(attention_mask, T, window, q.device), dropout_p)
