"""Encoder architectures, one file each, and the table that picks a class from `model_type` and task."""

from __future__ import annotations

from pathlib import Path

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


def from_pretrained(path: str | Path, task: str, int8: bool = False, **config_overrides):
    """Load a model directory as the class its config.json names for `task` (an AutoModelFor... in one line);
    `int8`: quantised for CPU inference (models/quantize.py)."""
    from unmask.hub import read_config

    config = read_config(Path(path))
    model = model_class(config.model_type, task).from_pretrained(path, **config_overrides)
    return quantize_int8(model) if int8 else model


def from_config(config, task: str):
    return model_class(config.model_type, task)(config)
