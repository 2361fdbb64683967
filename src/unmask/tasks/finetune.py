"""`unmask finetune TASK`: a head on a pretrained encoder, trained with a small learning rate, evaluated every
epoch, the best model kept (early stopping), exported in the HF layout `transformers`' AutoModelFor... loads.

Tasks: `classify` (one text, a label), `pair` (two texts: a label, or a score with --regression; a cross-encoder
reranker), `tag` (a label per word, CoNLL files), `embed` (a bi-encoder trained contrastively: CoSENT on scored
pairs, in-batch negatives on unscored ones; saved in the sentence-transformers layout).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from unmask.data.sources import DataError
from unmask.hub import atomic_write_text, load_tokenizer
from unmask import models
from unmask.tasks.classify import build_label_map, column, evaluate_classification, load_examples, read_table
from unmask.tasks.tag import align, evaluate_tagging, read_conll, tag_label_map
from unmask.train.loop import SampleOrder, TrainingArgs, init_distributed, train_loop

TASKS = ("classify", "pair", "tag", "embed")
HEADS = {"classify": "sequence-classification", "pair": "sequence-classification", "tag": "token-classification"}
HEAD_TASKS = tuple(HEADS)  # the tasks with a head of their own (embed trains the encoder itself)


def load_head_model(task: str, path: str, int8: bool = False, bf16: bool = False, **config_overrides):
    """The fine-tuning class of the directory's architecture (BERT or ModernBERT) for `task`."""
    return models.from_pretrained(path, HEADS[task], int8=int8, bf16=bf16, **config_overrides)


@dataclass(kw_only=True)
class FinetuneArgs(TrainingArgs):
    task: str
    model: str  # any encoder directory: ours, or a transformers / sentence-transformers one
    train_file: str
    validation_file: str | None = None
    text_column: str = "sentence"
    text_pair_column: str | None = None  # pair: the second text ("sentence2" when not given)
    label_column: str = "label"
    regression: bool = False  # pair/classify: predict a number (num_labels = 1, MSE)
    label_scale: float = 1.0  # regression targets are divided by this (STS-B: 5)
    max_seq_length: int = 128
    num_train_epochs: float = 3.0
    warmup_ratio: float = 0.1
    early_stopping_patience: int | None = None
    # fine-tuning defaults differ from pretraining's
    learning_rate: float = 5e-5
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8  # HF's default: with fine-tuning's small gradients 1e-6 damps the updates
    warmup_steps: int = 0  # 0: warmup_ratio of the steps
    max_steps: int = 0  # 0: num_train_epochs over the training data
    logging_steps: int = 50

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}, got {self.task!r}")
        if self.num_train_epochs <= 0 and self.max_steps <= 0:
            raise ValueError("give --num_train_epochs or --max_steps")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"--warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        super().__post_init__()


def _is_sts_release(path: str) -> bool:
    """The STS Benchmark release: no header, tab-separated, the score in the fifth field."""
    with open(path, encoding="utf-8", errors="replace") as f:
        fields = f.readline().rstrip("\n").split("\t")
    try:
        float(fields[4])
        return len(fields) >= 7
    except (IndexError, ValueError):
        return False


def load_task_data(args: FinetuneArgs, tokenizer, path: str, label2id: dict | None):
    """Examples of one file for the task; `label2id` None on the training file builds it (or means regression)."""
    if args.task == "tag":
        sentences, tags = read_conll(path)
        label2id = label2id or tag_label_map(tags)
        return align(tokenizer, sentences, tags, label2id, args.max_seq_length, path), label2id
    text_column, pair_column = args.text_column, args.text_pair_column
    if args.task == "pair":
        pair_column = pair_column or "sentence2"
        if _is_sts_release(path):
            from unmask.tasks.embed_eval import read_sts

            first, second, scores = read_sts(path)
            rows = [{"sentence1": a, "sentence2": b, "label": s} for a, b, s in zip(first, second, scores)]
            data = _from_rows(args, tokenizer, rows, path, "sentence1", "sentence2", label2id)
            return data, label2id
        if text_column == "sentence":
            text_column = "sentence1"
    if not args.regression and label2id is None:
        label2id = build_label_map(column(read_table(path), args.label_column, path))
        if len(label2id) < 2:
            raise DataError(f"{path}: column {args.label_column!r} has a single label; nothing to learn")
    data = load_examples(path, tokenizer, text_column, args.label_column, pair_column, args.max_seq_length,
                         None if args.regression else label2id)
    if args.regression and args.label_scale != 1.0:
        data.labels = [v / args.label_scale for v in data.labels]
    return data, label2id


def _from_rows(args, tokenizer, rows, path, first, second, label2id):
    from unmask.tasks.classify import ClassificationData, encode_texts

    ids, types, truncated = encode_texts(tokenizer, [r[first] for r in rows], [r[second] for r in rows],
                                         args.max_seq_length)
    if label2id is None:  # regression on the score
        labels = [float(r["label"]) / args.label_scale for r in rows]
    else:
        labels = [label2id[str(r["label"])] for r in rows]
    return ClassificationData(ids, types, labels, truncated)


def evaluate_task(task: str, model, data, pad_token_id: int, batch_size: int, device=torch.device("cpu")) -> dict:
    if task == "tag":
        return evaluate_tagging(model, data, pad_token_id, batch_size, device)
    return evaluate_classification(model, data, pad_token_id, batch_size, device)


def load_pairs(args: FinetuneArgs, tokenizer, path: str):
    """Bi-encoder pairs: the STS Benchmark release, or a table with two text columns (and optional scores)."""
    from unmask.tasks.embed import PairData
    from unmask.tasks.embed_eval import read_sts

    if _is_sts_release(path):
        first, second, scores = read_sts(path)
        scores = scores.tolist()
    else:
        rows = read_table(path)
        text_column = "sentence1" if args.text_column == "sentence" else args.text_column
        first = [str(v) for v in column(rows, text_column, path)]
        second = [str(v) for v in column(rows, args.text_pair_column or "sentence2", path)]
        scores = [float(v) for v in column(rows, args.label_column, path)] if args.label_column in rows[0] else None

    def ids(texts):
        return [e.ids if len(e.ids) <= args.max_seq_length else e.ids[: args.max_seq_length - 1] + e.ids[-1:]
                for e in tokenizer.encode_batch(texts)]

    return PairData(ids(first), ids(second), scores)


def _embed_setup(args: FinetuneArgs, tokenizer, device):
    """(bi-encoder to train, training pairs, evaluate) for the embed task; validation is an STS file."""
    from unmask.tasks.embed import BiEncoder, SentenceEncoder
    from unmask.tasks.embed_eval import evaluate_sts, read_sts

    encoder = SentenceEncoder.from_pretrained(args.model, max_seq_length=args.max_seq_length)
    train = load_pairs(args, tokenizer, args.train_file)
    if not args.validation_file:
        return BiEncoder(encoder), train, None
    valid = read_sts(args.validation_file)

    def evaluate() -> dict:  # encode() runs the model in eval mode and puts it back in training mode
        return evaluate_sts(encoder, *valid, batch_size=args.per_device_eval_batch_size)

    return BiEncoder(encoder), train, evaluate


def best_metric(args: FinetuneArgs) -> str:
    if args.task == "embed":
        return "eval_spearman"
    if args.task == "tag":
        return "eval_f1"
    return "eval_spearman" if args.regression else "eval_accuracy"


def _head_setup(args: FinetuneArgs, tokenizer, device):
    """(model with a new or loaded head, training data, evaluate) for classify / pair / tag."""
    if args.task == "pair" and not args.regression and _is_sts_release(args.train_file):
        raise DataError(f"{args.train_file}: STS Benchmark scores are numbers; add --regression (and "
                        "--label_scale 5)")
    train, label2id = load_task_data(args, tokenizer, args.train_file, None)
    valid = load_task_data(args, tokenizer, args.validation_file, label2id)[0] if args.validation_file else None
    if train.truncated or (valid is not None and valid.truncated):
        print(f"note: {train.truncated} training and {valid.truncated if valid else 0} validation examples are "
              f"longer than --max_seq_length {args.max_seq_length} and were truncated")
    if args.regression:
        config = {"num_labels": 1, "id2label": {0: "score"}, "label2id": {"score": 0}, "problem_type": "regression"}
    else:
        config = {"num_labels": len(label2id), "id2label": {i: l for l, i in label2id.items()},
                  "label2id": label2id, "problem_type": "single_label_classification"}
    model = load_head_model(args.task, args.model, **config)
    if valid is None:
        return model, train, None

    def evaluate() -> dict:
        result = evaluate_task(args.task, model, valid, tokenizer.pad_token_id, args.per_device_eval_batch_size,
                               device)
        result.pop("per_type", None)
        return result

    return model, train, evaluate


def finetune(args: FinetuneArgs) -> dict:
    """Fine-tune, keep the best epoch, export it to `args.output_dir`; returns its metrics and the timings."""
    dist = init_distributed()
    torch.manual_seed(args.seed)
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(args.model)
    setup = _embed_setup if args.task == "embed" else _head_setup
    model, train, evaluate = setup(args, tokenizer, dist.device)

    global_batch = args.per_device_train_batch_size * dist.world_size * args.gradient_accumulation_steps
    steps_per_epoch = math.ceil(len(train) / global_batch)
    max_steps = args.max_steps or max(1, math.ceil(args.num_train_epochs * steps_per_epoch))
    warmup_steps = args.warmup_steps or round(args.warmup_ratio * max_steps)
    loop_args = replace(args, max_steps=max_steps, warmup_steps=warmup_steps,
                        eval_steps=args.eval_steps or steps_per_epoch)
    order = SampleOrder(len(train), args.seed)
    if dist.is_main:
        atomic_write_text(output_dir / "finetune_args.json", json.dumps(asdict(loop_args), indent=2) + "\n")

    def make_batch(step: int, size: int) -> dict[str, torch.Tensor]:
        return train.collate(order.take(step * size, size), tokenizer.pad_token_id)

    result = train_loop(model, tokenizer, loop_args, make_batch, dist, evaluate=evaluate,
                        metric_for_best=best_metric(args) if evaluate else None,
                        early_stopping_patience=args.early_stopping_patience)
    if dist.is_main:
        atomic_write_text(output_dir / "eval_results.json", json.dumps(result, indent=2) + "\n")
    return result
