"""The one task vocabulary: every task names a head, every architecture has a class for every head, and a
directory's head is read from its `architectures` as `transformers` names its classes."""

from __future__ import annotations

import pytest

from unmask.config import BertConfig
from unmask.heads import (
    FINETUNE_TASKS,
    HEADS,
    LABELLED_TASKS,
    PREDICT_TASKS,
    SERVED_TASK,
    TASK_HEADS,
    head_of,
)
from unmask.models import MODEL_CLASSES


def test_every_task_has_a_head_and_every_architecture_a_class_for_it():
    assert set(TASK_HEADS.values()) == set(HEADS) == set(SERVED_TASK)
    assert set(FINETUNE_TASKS) | set(LABELLED_TASKS) | set(PREDICT_TASKS) <= set(TASK_HEADS)
    assert set(SERVED_TASK.values()) <= set(TASK_HEADS)
    for classes in MODEL_CLASSES.values():
        assert set(classes) == set(HEADS)
        for head, cls in classes.items():  # the class carries the head it is filed under
            assert head_of([cls.__name__]) == head


@pytest.mark.parametrize("architectures, head", [
    (["BertForMaskedLM"], "masked-lm"), (["ModernBertForSequenceClassification"], "sequence-classification"),
    (["BertForTokenClassification"], "token-classification"), (["BertModel"], "encoder"), (None, "encoder"),
    (["ElectraForPreTraining"], "encoder"),
])
def test_head_of_a_directory(architectures, head):
    assert head_of(architectures) == head
    assert head_of(BertConfig(architectures=architectures).architectures) == head
