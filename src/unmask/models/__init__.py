"""Encoder architectures, one file each, and the table that picks a class from `model_type` and task."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from unmask.models import bert, modernbert
from unmask.models.quantize import quantize_int8

TASK_CLASSES = {
    "bert": {"encoder": bert.BertModel, "masked-lm": bert.BertForMaskedLM,
             "sequence-classification": bert.BertForSequenceClassification,
             "token-classification": bert.BertForTokenClassification},
    "modernbert": {"encoder": modernbert.ModernBertModel, "masked-lm": modernbert.ModernBertForMaskedLM,
                   "sequence-classification": modernbert.ModernBertForSequenceClassification,
                   "token-classification": modernbert.ModernBertForTokenClassification},
}


def model_class(model_type: str, task: str):
    """The class for an architecture and a task, e.g. ("modernbert", "masked-lm") -> ModernBertForMaskedLM."""
    return TASK_CLASSES[model_type][task]


def from_pretrained(path: str | Path, task: str, int8: bool = False, bf16: bool = False, **config_overrides):
    """Load a model directory as the class its config.json names for `task` (an AutoModelFor... in one line);
    `int8` / `bf16`: for inference (see `for_inference`)."""
    from unmask.hub import read_config

    config = read_config(Path(path))
    model = model_class(config.model_type, task).from_pretrained(path, **config_overrides)
    return for_inference(model, int8, bf16)


def for_inference(model: torch.nn.Module, int8: bool = False, bf16: bool = False) -> torch.nn.Module:
    """The model as loaded (fp32), or for faster inference: `int8` quantises its linear layers (CPU only,
    models/quantize.py); `bf16` casts weights and activations to bfloat16 (GPUs, and CPUs with AVX512-BF16 or AMX;
    elsewhere bf16 products are emulated and slow). Both are for inference, not training."""
    if int8 and bf16:
        raise ValueError("int8 and bf16 exclude each other: choose one")
    if int8:
        return quantize_int8(model)
    if bf16:
        from unmask.train.loop import cpu_has_fast_bf16

        device = next(model.parameters()).device
        if device.type == "cpu" and not cpu_has_fast_bf16():
            warnings.warn("bf16 on a CPU without AVX512-BF16 or AMX: bf16 products are emulated here and run far "
                          "slower than fp32", stacklevel=2)
        return model.to(torch.bfloat16)
    return model


def from_config(config, task: str):
    return model_class(config.model_type, task)(config)
