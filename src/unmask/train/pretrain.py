"""Pretraining: from text files to a model directory `transformers` loads as it is.

Objectives: `mlm` (masked-LM, the model is BertForMaskedLM / ModernBertForMaskedLM) or `electra` (replaced-token
detection, objectives/electra.py; the export is the discriminator encoder). Setup here (tokenizer, config, token
cache, packing, dynamic-masking collator), the steps in `train.loop`.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from unmask.config import load_config
from unmask.data.collate import MLMCollator
from unmask.data.pretraining import PackedDataset, build_token_cache
from unmask.hub import atomic_write_text
from unmask.models import from_config
from unmask.models.bert import init_positions_sinusoidal
from unmask.objectives.electra import ElectraPretrainer
from unmask.tokenizer import Tokenizer, train_tokenizer
from unmask.train.loop import (
    Distributed,
    SampleOrder,
    TrainingArgs,
    TrainingError,
    autocast,
    init_distributed,
    to_device,
    train_loop,
)

__all__ = ["PretrainArgs", "TrainingError", "evaluate_electra", "evaluate_mlm", "pretrain"]
OBJECTIVES = ("mlm", "electra")
POSITION_INITS = ("sinusoidal", "normal")


def default_cache_root() -> Path:
    return Path(os.environ.get("UNMASK_CACHE", Path.home() / ".cache" / "unmask")) / "tokens"


@dataclass(kw_only=True)
class PretrainArgs(TrainingArgs):
    train_file: list[str]
    validation_file: list[str] = field(default_factory=list)
    model_config: str = "bert-mini"  # a preset name (bert-*, modernbert-*) or a config.json
    objective: str = "mlm"  # mlm | electra
    generator_size: float = 0.25  # electra: the generator's width as a fraction of the discriminator's
    rtd_weight: float = 50.0  # electra: loss = MLM + rtd_weight x replaced-token detection
    position_init: str = "sinusoidal"  # BERT's learned positions start from: sinusoidal | normal (HF's noise)
    tokenizer: str | None = None  # an HF tokenizer directory; None trains one with vocab_size
    vocab_size: int = 30522
    max_seq_length: int = 128
    mlm_probability: float = 0.15
    whole_word_mask: bool = False
    cross_documents: bool = False
    max_eval_samples: int | None = None
    text_field: str = "text"
    cache_dir: str | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.max_steps < 1:
            raise ValueError(f"--max_steps must be at least 1, got {self.max_steps}")
        if not 0.0 < self.mlm_probability < 1.0:
            raise ValueError(f"--mlm_probability must be in (0, 1), got {self.mlm_probability}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"--objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        if self.position_init not in POSITION_INITS:
            raise ValueError(f"--position_init must be one of {', '.join(POSITION_INITS)}, got {self.position_init!r}")


def prepare_tokenizer(args: PretrainArgs, dist: Distributed) -> Tokenizer:
    if args.tokenizer:
        return Tokenizer.from_pretrained(args.tokenizer)
    tokenizer_dir = Path(args.output_dir) / "tokenizer"
    if dist.is_main and not (tokenizer_dir / "tokenizer.json").exists():
        train_tokenizer(args.train_file, args.vocab_size, output_dir=tokenizer_dir, text_field=args.text_field,
                        model_max_length=args.max_seq_length, show_progress=args.show_progress)
    dist.barrier()
    return Tokenizer.from_pretrained(tokenizer_dir)


def _evaluation_batches(model, dataset: PackedDataset, tokenizer: Tokenizer, batch_size: int,
                        mlm_probability: float, max_samples: int | None, bf16: bool, seed: int, device):
    """(batch, output) over the validation data, masked with a fixed seed (comparable across runs and steps);
    the model is in eval mode, without gradients, and the global RNG (ELECTRA's sampling) is restored after."""
    was_training = model.training
    model.eval()
    collate = MLMCollator.from_tokenizer(tokenizer, mlm_probability=mlm_probability, seed=seed)
    n = len(dataset) if max_samples is None else min(len(dataset), max_samples)
    with torch.no_grad(), torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        for start in range(0, n, batch_size):
            batch = to_device(collate([dataset[i] for i in range(start, min(n, start + batch_size))]), device)
            with autocast(bf16, device):
                yield batch, model(**batch)
    model.train(was_training)


def evaluate_mlm(model, dataset: PackedDataset, tokenizer: Tokenizer, batch_size: int = 64,
                 mlm_probability: float = 0.15, max_samples: int | None = None, bf16: bool = False,
                 seed: int = 0, device: torch.device = torch.device("cpu")) -> dict:
    """Masked-LM loss, masked-token accuracy and perplexity."""
    loss_sum, correct, count = 0.0, 0, 0
    for batch, out in _evaluation_batches(model, dataset, tokenizer, batch_size, mlm_probability, max_samples,
                                          bf16, seed, device):
        targets = batch["labels"][out.predicted_positions]  # (M,), -100 at the rows no label is on
        scored = targets != -100
        k = int(scored.sum())
        if k:
            loss_sum += float(out.loss) * k
            correct += int((out.logits.argmax(-1)[scored] == targets[scored]).sum())
            count += k
    if count == 0:
        raise TrainingError("the validation data has no maskable tokens")
    loss = loss_sum / count
    return {"loss": loss, "accuracy": correct / count, "perplexity": math.exp(min(loss, 50.0)), "tokens": count}


def evaluate_electra(model: ElectraPretrainer, dataset: PackedDataset, tokenizer: Tokenizer, batch_size: int = 64,
                     mlm_probability: float = 0.15, max_samples: int | None = None, bf16: bool = False,
                     seed: int = 0, device: torch.device = torch.device("cpu")) -> dict:
    """The generator's MLM loss and accuracy; the discriminator's detection loss, accuracy over real tokens, and
    recall of the replaced ones (the rare class: guessing 'original' everywhere scores ~93% accuracy)."""
    sums = dict.fromkeys(["mlm", "correct", "masked", "rtd", "rtd_correct", "tokens", "found", "replaced"], 0.0)
    for batch, out in _evaluation_batches(model, dataset, tokenizer, batch_size, mlm_probability, max_samples,
                                          bf16, seed, device):
        masked = batch["labels"] != -100
        real = batch["attention_mask"].bool()
        k, t = int(masked.sum()), int(real.sum())
        guess = out.rtd_logits > 0  # (B, T)
        sums["mlm"] += float(out.mlm_loss) * k
        targets = batch["labels"][out.generator_positions]  # (M,), -100 at the rows no label is on
        sums["correct"] += int((out.generator_logits.argmax(-1) == targets)[targets != -100].sum())
        sums["masked"] += k
        sums["rtd"] += float(out.rtd_loss) * t
        sums["rtd_correct"] += int((guess == out.replaced)[real].sum())
        sums["tokens"] += t
        sums["found"] += int((guess & out.replaced).sum())
        sums["replaced"] += int(out.replaced.sum())
    if sums["masked"] == 0:
        raise TrainingError("the validation data has no maskable tokens")
    return {"generator_loss": sums["mlm"] / sums["masked"], "generator_accuracy": sums["correct"] / sums["masked"],
            "rtd_loss": sums["rtd"] / sums["tokens"], "rtd_accuracy": sums["rtd_correct"] / sums["tokens"],
            "rtd_recall": sums["found"] / max(1, sums["replaced"]), "tokens": int(sums["tokens"])}


def packed(files: list[str], tokenizer, args: PretrainArgs, dist: Distributed, cross_documents: bool = False):
    """Rank 0 tokenizes (with a progress bar) while the others wait, then every rank opens the same cache."""
    cache_root = Path(args.cache_dir) if args.cache_dir else default_cache_root()
    if dist.is_main:
        build_token_cache(files, tokenizer, cache_root, args.text_field, args.show_progress)
    dist.barrier()
    cache = build_token_cache(files, tokenizer, cache_root, args.text_field, show_progress=False)
    return PackedDataset.from_cache(cache, tokenizer, args.max_seq_length, cross_documents)


def pretrain(args: PretrainArgs) -> dict:
    """Pretrain with `args.objective`; returns the final metrics. The model is exported to `args.output_dir`."""
    dist = init_distributed()
    torch.manual_seed(args.seed)
    Path(args.output_dir).mkdir(parents=True, exist_ok=True)
    tokenizer = prepare_tokenizer(args, dist)
    # the special ids are the tokenizer's (ModernBERT's defaults belong to its own 50k vocabulary)
    config = load_config(args.model_config, vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_token_id,
                         cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id,
                         bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id)
    if args.max_seq_length > config.max_position_embeddings:
        raise ValueError(f"--max_seq_length {args.max_seq_length} exceeds the model's max_position_embeddings "
                         f"{config.max_position_embeddings}")
    if args.objective == "electra":
        model = ElectraPretrainer(config, args.generator_size, args.rtd_weight)
    else:
        model = from_config(config, "masked-lm")
    if args.position_init == "sinusoidal":  # a resumed run loads its weights over it
        init_positions_sinusoidal(model, config.initializer_range)  # no effect on ModernBERT (rotary positions)
    train_data = packed(args.train_file, tokenizer, args, dist, args.cross_documents)
    valid_data = packed(args.validation_file, tokenizer, args, dist) if args.validation_file else None
    collate = MLMCollator.from_tokenizer(tokenizer, mlm_probability=args.mlm_probability,
                                         whole_word_mask=args.whole_word_mask, seed=args.seed)
    order = SampleOrder(len(train_data), args.seed)
    if dist.is_main:
        atomic_write_text(Path(args.output_dir) / "pretrain_args.json", json.dumps(asdict(args), indent=2) + "\n")

    def make_batch(step: int, size: int) -> dict[str, torch.Tensor]:
        return collate([train_data[i] for i in order.take(step * size, size)])

    def evaluate() -> dict:
        evaluate_objective = evaluate_electra if args.objective == "electra" else evaluate_mlm
        return evaluate_objective(model, valid_data, tokenizer, args.per_device_eval_batch_size,
                                  max_samples=args.max_eval_samples, bf16=args.bf16, device=dist.device)

    return train_loop(model, tokenizer, args, make_batch, dist, evaluate=evaluate if valid_data else None,
                      generators=(collate.generator,))
