"""`unmask finetune TASK`: a head on a pretrained encoder, trained with a small learning rate, evaluated every
epoch, the best model kept (early stopping), exported in the HF layout `transformers`' AutoModelFor... loads.

Tasks: `classify` (one text, a label), `pair` (two texts: a label, or a score with --regression; a cross-encoder
reranker), `tag` (a label per word, CoNLL files), `embed` (a bi-encoder trained contrastively: CoSENT on scored
pairs; multiple-negatives ranking on pairs and (anchor, positive, negative...) tuples, over every rank's batch under
torchrun, optionally with gradient caching, Matryoshka dimensions and a cross-encoder's scores distilled; saved in
the sentence-transformers layout).
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass, fields, replace
from functools import partial
from pathlib import Path

import torch

from unmask import models
from unmask.data.labelled import (
    LabelledFormat,
    RankingData,
    first_examples,
    labels_seen,
    load_beir_pairs,
    load_pairs,
    load_task_data,
)
from unmask.data.readers import is_sts_release, read_sts
from unmask.errors import DataError, UsageError
from unmask.heads import TASK_HEADS, check_head
from unmask.hub import load_weights, read_config, read_weights
from unmask.io import atomic_write_text
from unmask.objectives.contrastive import (
    candidate_scores,
    cosent_loss,
    cross_encoder_ranking_loss,
    duplicate_positives,
    flops,
    kl_distillation_loss,
    margin_mse_loss,
    multiple_negatives_ranking_loss,
    text_keys,
)
from unmask.pipelines.classify import pair_scores
from unmask.pipelines.embed import SentenceEncoder, pool
from unmask.pipelines.sparse import lower_to_sparse, splade_pool
from unmask.tokenizer import load_tokenizer
from unmask.train.args import FinetuneArgs
from unmask.train.checkpoint import prepare_output_dir
from unmask.train.distributed import gather_rows, init_distributed, rank_rows
from unmask.train.evaluate import evaluate_ranking, evaluate_sts, evaluate_task
from unmask.train.gradcache import cached_embeddings
from unmask.train.loop import Evaluation, SampleOrder, train_loop


def load_head_model(task: str, path: str, int8: bool = False, bf16: bool = False, config=None, **config_overrides):
    """The fine-tuning class of the directory's architecture (BERT or ModernBERT) for `task`."""
    return models.from_pretrained(path, TASK_HEADS[task], int8=int8, bf16=bf16, config=config, **config_overrides)


@dataclass
class _LossOutput:
    loss: torch.Tensor


class BiEncoder(torch.nn.Module):
    """The training view of a SentenceEncoder (dense vectors, cosine x 20) or of a masked-LM (SPLADE vectors over
    the vocabulary, dot product as sentence-transformers' SparseMultipleNegativesRankingLoss, plus FLOPS
    regularisation: the squared mean weight of each vocabulary entry, summed, so that few stay non-zero): two batches
    of texts in, a contrastive loss out."""

    base_model_prefix = "bert"

    def __init__(self, encoder, matryoshka_dims: list[int] | None = None, mini_batch_tokens: int | None = None,
                 distillation: str = "margin_mse", symmetric: bool = False,
                 flops_weights: tuple[float, float] = (0.0, 0.0)):
        super().__init__()
        self.sparse = not isinstance(encoder, SentenceEncoder)  # a masked-LM: SPLADE
        self.encoder = None if self.sparse else encoder
        self.bert = encoder if self.sparse else encoder.model  # registered: optimiser, DDP, checkpoints see it
        self.config = self.bert.config
        width = self.config.vocab_size if self.sparse else self.config.hidden_size
        if any(d > width for d in matryoshka_dims or []):
            raise UsageError(f"--matryoshka_dims {','.join(map(str, matryoshka_dims))}: the model's vectors have "
                             f"{width} dimensions")
        self.dims = matryoshka_dims or [width]  # the loss at each leading dimension, summed (Matryoshka)
        self.mini_batch_tokens = mini_batch_tokens  # set: gradient caching, mini-batches of this many tokens
        self.distill = {"margin_mse": margin_mse_loss, "kl": kl_distillation_loss}[distillation]
        self.symmetric = symmetric  # the ranking loss also ranks each positive's anchor among the anchors
        self.flops_weights = flops_weights  # SPLADE: (anchors', documents') FLOPS regularisation weights
        # under torchrun the loop averages the gradients after backward, not DDP: gradient caching replays backward
        # passes DDP cannot hook, and the encoder's pooler (in the checkpoint, unused here) gets no gradient
        self.averages_gradients_itself = True

    def embed_all(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, last: bool = False) -> torch.Tensor:
        """`last`: the step's last texts, whose last mini-batch may keep its graph (see gradcache)."""
        if self.mini_batch_tokens and self.training:
            return cached_embeddings(self.embed, input_ids, attention_mask, self.mini_batch_tokens, keep_last=last)
        return self.embed(input_ids, attention_mask)

    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.sparse:
            return splade_pool(self.bert, input_ids, attention_mask)  # (B, V)
        return pool(self.bert(input_ids, attention_mask).last_hidden_state, attention_mask, self.encoder.pooling)

    def forward(self, input_ids, attention_mask, input_ids_b, attention_mask_b, labels,
                teacher_scores=None) -> _LossOutput:
        a = self.embed_all(input_ids, attention_mask)  # (B, H)
        if labels.is_floating_point():  # scored pairs: (B, T) each
            b = self.embed_all(input_ids_b, attention_mask_b, last=True)
            return _LossOutput(sum(cosent_loss(a[:, :d], b[:, :d], labels) for d in self.dims))
        B, n, T = input_ids_b.shape  # (B, 1 + k, T): each anchor's positive, then its negatives
        candidate_ids, candidate_mask = (t.transpose(0, 1).reshape(B * n, T) for t in (input_ids_b, attention_mask_b))
        candidates = self.embed_all(candidate_ids, candidate_mask, last=True)  # (C, H): positives, then negatives
        loss = self.ranking_loss(a, candidates, text_keys(candidate_ids, candidate_mask))
        if self.sparse:  # FLOPS: this rank's anchors, and all its documents (positives and negatives)
            loss = loss + self.flops_weights[0] * flops(a) + self.flops_weights[1] * flops(candidates)
        if teacher_scores is not None:  # (B, 1 + k): each anchor's own candidates, as the teacher scored them
            own = candidates.view(n, B, -1).transpose(0, 1)  # (B, 1 + k, H)
            loss = loss + sum(self.distill(candidate_scores(a[:, :d], own[..., :d]), teacher_scores)
                              for d in self.dims)
        return _LossOutput(loss)

    def ranking_loss(self, anchors: torch.Tensor, candidates: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """Multiple-negatives ranking at each dimension. Under torchrun this rank's anchors rank against every rank's
        candidates, laid out as one process's global batch (all positives first); gradients flow back to the rank
        each row came from, so the step is the global batch's."""
        (B, H), n = anchors.shape, len(candidates) // len(anchors)
        rows = torch.cat([anchors, candidates]).view(1 + n, B, H).transpose(0, 1)  # (B, 1 + n, H)
        gathered = gather_rows(rows)  # (W B, 1 + n, H), rank 0's rows first
        all_anchors, all_candidates = gathered[:, 0], gathered[:, 1:].transpose(0, 1).reshape(-1, H)
        all_keys = gather_rows(keys.view(n, B).T).T.reshape(-1)  # (W C,), in all_candidates' order
        own = rank_rows(B)
        duplicates = duplicate_positives(all_keys, torch.arange(own.start, own.stop, device=keys.device))
        scale = 1.0 if self.sparse else 20.0  # SPLADE: the raw dot product; dense: cosine x 20
        return sum(multiple_negatives_ranking_loss(all_anchors[:, :d], all_candidates[:, :d], duplicates, scale,
                                                   self.symmetric, own, normalize=not self.sparse) for d in self.dims)

    def save_pretrained(self, output_dir, tokenizer=None) -> Path:
        if self.sparse:
            return self.bert.save_pretrained(output_dir, tokenizer=tokenizer)
        return self.encoder.save_pretrained(output_dir)


class CrossEncoderRanker(torch.nn.Module):
    """The training view of a one-label cross-encoder on ranking batches (`RankingData`): every pair of the batch
    scored in one forward, each anchor's candidates ranked by a softmax (`cross_encoder_ranking_loss`)."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.config = model.config
        self.base_model_prefix = f"model.{model.base_model_prefix}"  # the head's own parameters lie outside it

    def forward(self, input_ids, attention_mask, token_type_ids, candidate_mask, labels) -> _LossOutput:
        B, n, T = input_ids.shape  # each anchor's n candidates, as pairs of T tokens
        logits = self.model(input_ids.view(B * n, T), attention_mask.view(B * n, T),
                            token_type_ids.view(B * n, T)).logits  # (B n, 1)
        return _LossOutput(cross_encoder_ranking_loss(logits.view(B, n), candidate_mask))

    def save_pretrained(self, output_dir, tokenizer=None) -> Path:
        return self.model.save_pretrained(output_dir, tokenizer=tokenizer)

    def restore_weights(self, checkpoint: Path) -> None:
        load_weights(self.model, read_weights(checkpoint), str(checkpoint))


def cross_encoder_scorer(path: str, batch_size: int):
    """(query, document) pairs -> the cross-encoder's relevance logit of each (documents cut at its context)."""
    config = read_config(path)
    check_head("finetune embed --teacher", "rerank", path, config.architectures)  # never a made-up random head
    model = load_head_model("rerank", path, config=config).eval()
    tokenizer = load_tokenizer(path, model.config)
    print(f"scoring the training tuples with the teacher {path}", file=sys.stderr, flush=True)

    return partial(pair_scores, model, tokenizer, truncation="truncate", batch_size=batch_size)


def labelled_format(args: FinetuneArgs) -> LabelledFormat:
    return LabelledFormat(**{f.name: getattr(args, f.name) for f in fields(LabelledFormat)})


def _embed_setup(args: FinetuneArgs, tokenizer):
    """(bi-encoder to train, training pairs, evaluate) for embed (validation: an STS file) and sparse (SPLADE from
    a masked-LM directory; no validation here: `unmask eval retrieval --sparse`)."""
    if args.task == "sparse":
        config = read_config(args.model)
        check_head("unmask finetune sparse", "sparse", args.model, config.architectures)  # never a random head
        encoder = load_head_model("sparse", args.model, config=config)
    else:
        encoder = SentenceEncoder.from_pretrained(args.model, max_seq_length=args.max_seq_length)
    spec = labelled_format(args)
    if args.teacher and not args.train_file:
        raise UsageError("--teacher scores each anchor's positive and hard negatives: give a --train_file of "
                         "(anchor, positive, negative...) rows, e.g. from unmask mine")
    teacher = cross_encoder_scorer(args.teacher, args.per_device_eval_batch_size) if args.teacher else None
    train = (load_pairs(spec, tokenizer, args.train_file, teacher) if args.train_file else
             load_beir_pairs(spec, tokenizer, args.corpus, args.queries, args.qrels))
    train = first_examples(train, args.max_train_samples)
    if args.task == "sparse":  # a start with sparse vectors (the masked LM's predictions unchanged)
        shift = lower_to_sparse(encoder, train.a[:32] + train.b[:32], tokenizer.pad_token_id)
        print(f"SPLADE start: the head's logits lowered by {shift:.2f}", file=sys.stderr, flush=True)
    model = BiEncoder(encoder, args.dimensions, args.mini_batch_tokens, args.distillation, args.symmetric,
                      (args.query_regularizer_weight, args.document_regularizer_weight))
    if not args.validation_file:
        return model, train, None
    valid = [part[: args.max_eval_samples] for part in read_sts(args.validation_file)]

    def evaluate() -> dict:  # encode() runs the model in eval mode and puts it back in training mode
        return evaluate_sts(encoder, *valid, batch_size=args.per_device_eval_batch_size)

    return model, train, evaluate


def best_metric(args: FinetuneArgs) -> str:
    if args.task == "embed":
        return "eval_spearman"
    if args.task == "tag":
        return "eval_f1"
    return "eval_spearman" if args.regression else "eval_accuracy"


def _head_setup(args: FinetuneArgs, tokenizer):
    """(model with a new or loaded head, training data, evaluate) for classify / pair / tag."""
    if args.task == "pair" and not args.regression and is_sts_release(args.train_file):
        raise DataError(f"{args.train_file}: STS Benchmark scores are numbers; add --regression (and "
                        "--label_scale 5)")
    spec = labelled_format(args)
    given = {name: i for i, name in enumerate(args.label_names)} or None
    train, label2id = load_task_data(spec, tokenizer, args.train_file, given)  # else: labels from the whole file
    train = first_examples(train, args.max_train_samples)
    if isinstance(train, RankingData):
        return _ranking_setup(args, spec, tokenizer, train)
    valid = load_task_data(spec, tokenizer, args.validation_file, label2id)[0] if args.validation_file else None
    if valid is not None and not args.regression and given is None:
        unseen = [name for name, i in label2id.items() if i not in labels_seen(valid)]
        if unseen:
            raise DataError(f"{args.train_file}: label(s) {', '.join(map(repr, unseen))} occur in the training file "
                            f"but never in {args.validation_file}, so the model would get {len(label2id)} classes; "
                            "fix the file, or give every label with --labels")
    valid = first_examples(valid, args.max_eval_samples) if valid is not None else None
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
                               show_progress=args.show_progress)
        result.pop("per_type", None)
        return result

    return model, train, evaluate


def _ranking_setup(args: FinetuneArgs, spec: LabelledFormat, tokenizer, train: RankingData):
    """(one-label cross-encoder, ranking examples, evaluate) for pair on an (anchor, positive, negative...) table:
    a reranker, as sentence-transformers' CrossEncoder with its MultipleNegativesRankingLoss."""
    if args.labels or args.regression:
        raise UsageError(f"{args.train_file} is an (anchor, positive, negative...) table: finetune pair trains a "
                         "reranker from it (one relevance score); --labels and --regression are for labelled pairs")
    valid = load_task_data(spec, tokenizer, args.validation_file, None)[0] if args.validation_file else None
    if valid is not None and not isinstance(valid, RankingData):
        raise DataError(f"{args.validation_file}: validate a reranker on a table like its training file (anchor, "
                        "positive, negative... columns)")
    valid = first_examples(valid, args.max_eval_samples) if valid is not None else None
    if train.truncated:
        print(f"note: {train.truncated} training pairs are longer than --max_seq_length {args.max_seq_length} and "
              "were truncated")
    model = load_head_model("pair", args.model, num_labels=1, id2label={0: "LABEL_0"}, label2id={"LABEL_0": 0})
    if valid is None:
        return CrossEncoderRanker(model), train, None

    def evaluate() -> dict:
        return evaluate_ranking(model, valid, tokenizer.pad_token_id, args.per_device_eval_batch_size,
                                show_progress=args.show_progress)

    return CrossEncoderRanker(model), train, evaluate


def finetune(args: FinetuneArgs) -> dict:
    """Fine-tune, keep the best epoch, export it to `args.output_dir`; returns its metrics and the timings."""
    dist = init_distributed()
    torch.manual_seed(args.seed)
    output_dir = Path(args.output_dir)
    if dist.is_main:
        prepare_output_dir(output_dir, resuming=bool(args.resume_from_checkpoint), overwrite=args.overwrite_output_dir)
    dist.barrier()
    tokenizer = load_tokenizer(args.model)
    setup = _embed_setup if args.task in ("embed", "sparse") else _head_setup
    model, train, evaluate = setup(args, tokenizer)
    models.set_attn_backend(model, args.attn_backend)

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

    evaluation = Evaluation(evaluate, best_metric(args), patience=args.early_stopping_patience) if evaluate else None
    result = train_loop(model, tokenizer, loop_args, make_batch, dist, evaluation=evaluation)
    if dist.is_main:
        atomic_write_text(output_dir / "eval_results.json", json.dumps(result, indent=2) + "\n")
    return result
