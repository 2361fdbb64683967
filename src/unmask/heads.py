"""One vocabulary: the heads a model directory can carry, and the tasks of `unmask` that train or run each one.

A directory's head is read from its `config.json` `architectures` (HF class names): `...ForMaskedLM` is a masked-LM,
`...ForSequenceClassification` a classifier (or a cross-encoder), `...ForTokenClassification` a tagger; anything else
(`BertModel`, a sentence-transformers directory, an ELECTRA discriminator export) is an encoder. The model classes per
architecture and head are in `unmask.models.MODEL_CLASSES`; the finetune, eval, predict and serve tables derive from
`TASK_HEADS` below.
"""

from __future__ import annotations

from unmask.errors import UsageError

HEADS = ("encoder", "masked-lm", "sequence-classification", "token-classification")

# task -> the head it trains or runs
TASK_HEADS = {
    "embed": "encoder",  # sentence vectors (pooling over the encoder's token vectors)
    "sparse": "masked-lm",  # SPLADE vectors over the vocabulary, from the masked-LM head
    "fill-mask": "masked-lm",
    "classify": "sequence-classification",  # one text -> a label
    "pair": "sequence-classification",  # two texts -> a label or a score (a cross-encoder)
    "rerank": "sequence-classification",  # a query and documents -> relevance, with a pair model
    "tag": "token-classification",  # a label per word
}
FINETUNE_TASKS = ("classify", "pair", "tag", "embed", "sparse")  # `unmask finetune TASK`
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

# what a user can run on a directory with each head (the hint when a command gets the wrong kind)
COMMANDS_FOR_HEAD = {
    "encoder": "unmask embed, unmask eval sts / retrieval, unmask finetune, unmask serve",
    "masked-lm": "unmask fill-mask, unmask eval mlm, unmask pretrain --model_name_or_path, unmask finetune sparse, "
                 "unmask embed / eval retrieval --sparse, unmask serve",
    "sequence-classification": "unmask predict classify / rerank, unmask eval classify / pair, unmask serve",
    "token-classification": "unmask predict tag, unmask eval tag, unmask serve",
}
_HEAD_NAMES = {"encoder": "an encoder without a task head", "masked-lm": "a masked-LM",
               "sequence-classification": "a sequence classifier", "token-classification": "a token classifier"}


def check_head(command: str, task: str, path, architectures: list[str] | None) -> None:
    """Refuse a directory whose head does not fit `task` (`TASK_HEADS`), naming what it is and what fits it: a
    head that is not there would be made up from random weights, and its output would be noise."""
    found, needed = head_of(architectures), TASK_HEADS[task]
    if found != needed:
        named = f" ({architectures[0]})" if architectures else ""
        raise UsageError(f"{command} needs {_HEAD_NAMES[needed]}, and {path} holds {_HEAD_NAMES[found]}{named}; "
                         f"that directory fits: {COMMANDS_FOR_HEAD[found]}")
