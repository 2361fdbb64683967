"""Encoder architectures, one file each, and the one table that picks a class from `model_type` and head."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from unmask.config import check_backend
from unmask.errors import UsageError
from unmask.hub import read_config
from unmask.models import bert, modernbert
from unmask.models.attention import set_attn_backend  # noqa: F401  (models.set_attn_backend)
from unmask.models.quantize import quantize_int8

# model_type -> head (unmask.heads.HEADS) -> class
MODEL_CLASSES = {
    "bert": {"encoder": bert.BertModel, "masked-lm": bert.BertForMaskedLM,
             "sequence-classification": bert.BertForSequenceClassification,
             "token-classification": bert.BertForTokenClassification},
    "modernbert": {"encoder": modernbert.ModernBertModel, "masked-lm": modernbert.ModernBertForMaskedLM,
                   "sequence-classification": modernbert.ModernBertForSequenceClassification,
                   "token-classification": modernbert.ModernBertForTokenClassification},
}


def model_class(model_type: str, head: str):
    """The class for an architecture and a head, e.g. ("modernbert", "masked-lm") -> ModernBertForMaskedLM."""
    return MODEL_CLASSES[model_type][head]


def from_pretrained(path: str | Path, head: str, int8: bool = False, bf16: bool = False, config=None,
                    backend: str = "torch", **config_overrides):
    """Load a model directory as the class its config.json names for `head` (an AutoModelFor... in one line);
    `config`: the directory's config when the caller has read it already; `int8` / `bf16`: for inference (see
    `for_inference`); `backend="onnxruntime"`: its exported graph in ONNX Runtime, exported once (models/onnx.py)."""
    check_backend(backend, bf16)
    config = config if config is not None else read_config(path)
    if backend == "onnxruntime":
        from unmask.models.onnx import onnxruntime_model  # onnxruntime is an optional dependency

        return onnxruntime_model(path, config, head, lambda: from_pretrained(path, head, config=config), int8)
    model = model_class(config.model_type, head).from_pretrained(path, config, **config_overrides)
    return for_inference(model, int8, bf16)


def for_inference(model: torch.nn.Module, int8: bool = False, bf16: bool = False) -> torch.nn.Module:
    """The model as loaded (fp32), or for faster inference: `int8` quantises its linear layers (CPU only,
    models/quantize.py); `bf16` casts weights and activations to bfloat16 (GPUs, and CPUs with AVX512-BF16 or AMX;
    elsewhere bf16 products are emulated and slow). Both are for inference, not training."""
    if int8 and bf16:
        raise UsageError("int8 and bf16 exclude each other: choose one")
    if int8:
        return quantize_int8(model)
    if bf16:
        warn_if_slow_bf16(True, next(model.parameters()).device)
        return model.to(torch.bfloat16)
    return model


def cpu_has_fast_bf16() -> bool:
    """AVX512-BF16 or AMX: without either, CPU bf16 matrix products are emulated and far slower than fp32."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def warn_if_slow_bf16(enabled: bool, device: torch.device) -> None:
    if enabled and device.type == "cpu" and not cpu_has_fast_bf16():
        warnings.warn("bf16 on a CPU without AVX512-BF16 or AMX: bf16 matrix products are emulated here and run "
                      "10-80x slower than fp32; use fp32 on this machine", stacklevel=3)


def from_config(config, head: str):
    return model_class(config.model_type, head)(config)
