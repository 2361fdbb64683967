"""One vocabulary: the heads a model directory can carry, and the tasks of `unmask` that train or run each one.

A directory's head is read from its `config.json` `architectures` (HF class names): `...ForMaskedLM` is a masked-LM,
`...ForSequenceClassification` a classifier (or a cross-encoder), `...ForTokenClassification` a tagger; anything else
(`BertModel`, a sentence-transformers directory, an ELECTRA discriminator export) is an encoder. The model classes per
architecture and head are in `unmask.models.MODEL_CLASSES`; the finetune, eval, predict and serve tables derive from
`TASK_HEADS` below.
"""

from __future__ import annotations

HEADS = ("encoder", "masked-lm", "sequence-classification", "token-classification")

# task -> the head it trains or runs
TASK_HEADS = {
    "embed": "encoder",  # sentence vectors (pooling over the encoder's token vectors)
    "fill-mask": "masked-lm",
    "classify": "sequence-classification",  # one text -> a label
    "pair": "sequence-classification",  # two texts -> a label or a score (a cross-encoder)
    "rerank": "sequence-classification",  # a query and documents -> relevance, with a pair model
    "tag": "token-classification",  # a label per word
}
FINETUNE_TASKS = ("classify", "pair", "tag", "embed")  # `unmask finetune TASK`
LABELLED_TASKS = ("classify", "pair", "tag")  # `unmask eval TASK`: metrics on a labelled file
PREDICT_TASKS = ("classify", "tag", "rerank")  # `unmask predict TASK`
SERVED_TASK = {"encoder": "embed", "masked-lm": "fill-mask", "sequence-classification": "classify",
               "token-classification": "tag"}  # what `unmask serve` answers for a head

_SUFFIXES = {"ForMaskedLM": "masked-lm", "ForSequenceClassification": "sequence-classification",
             "ForTokenClassification": "token-classification"}


def head_of(architectures: list[str] | None) -> str:
    """The head named by a config's `architectures` (encoder when none matches)."""
    for architecture in architectures or []:
        for suffix, head in _SUFFIXES.items():
            if architecture.endswith(suffix):
                return head
    return "encoder"
