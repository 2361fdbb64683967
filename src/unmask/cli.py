"""The `unmask` command. Flags are snake_case, as in Hugging Face's scripts."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import re
import sys
import time
from pathlib import Path

from unmask import __version__
from unmask.config import INFERENCE_BACKENDS
from unmask.errors import UnmaskError, UsageError
from unmask.heads import FINETUNE_TASKS, LABELLED_TASKS, PREDICT_TASKS, TASK_HEADS, check_head


class _Switch(argparse.Action):
    """A yes/no flag spelled with underscores throughout: `--show_progress` / `--no_show_progress`."""

    def __init__(self, option_strings, dest, default=None, help=None, **_):
        negated = [f"--no_{option[2:]}" for option in option_strings if option.startswith("--")]
        super().__init__([*option_strings, *negated], dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, not option_string.startswith("--no_"))

    def format_usage(self) -> str:
        return " | ".join(self.option_strings)


class _Once(argparse._StoreAction):
    """A file flag that takes one file: given twice, an error (argparse would keep the last and drop the first)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if getattr(namespace, self.dest) is not None:  # file flags default to None
            parser.error(f"{option_string} is given twice: it takes one value")
        setattr(namespace, self.dest, values)


def _probability(value: str) -> float:
    p = float(value)
    if not 0.0 < p < 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (exclusive), got {value}")
    return p


def _add_demo_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the readable report")
    parser.add_argument("--plot", metavar="FILE.png", help="draw the lesson's two-panel figure")
    parser.add_argument("--mlm_probability", type=_probability, default=0.15,
                        help="probability that a maskable token is chosen (default 0.15)")
    parser.add_argument("--mask_special_tokens", action="store_true",
                        help="drop the guard that keeps [CLS]/[SEP] from being chosen")
    parser.add_argument("--shared_follower", action="store_true",
                        help='"sat" and "ran" are both followed by "on"')
    parser.add_argument("--blank", choices=["verb", "subject"], default="verb",
                        help="the word the fill-in-the-blank test hides (subject = position 1)")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the masking draws (default 0)")


def _run_demo(args) -> None:
    from unmask.demo import DemoOptions, main

    options = DemoOptions(mlm_probability=args.mlm_probability, mask_special_tokens=args.mask_special_tokens,
                          shared_follower=args.shared_follower, blank=args.blank, seed=args.seed)
    main(options, as_json=args.json, plot_path=args.plot)


def _run_quickstart(args) -> None:
    from unmask.quickstart import quickstart

    print("unmask quickstart, part 1: the lesson on its embedded synthetic data\n")
    _run_demo(args)
    print("\nunmask quickstart, part 2: pretrain a tiny BERT on the same grammar, then fill blanks\n")
    quickstart(args.output_dir, seed=args.seed)


def _run_example_data(args) -> None:
    from unmask.example_data import write_example_data

    root = Path(args.output_dir)
    if root.exists() and any(root.iterdir()) and not args.overwrite:
        raise UsageError(f"{root} is not empty: give an empty or new directory, or --overwrite to replace the "
                         "sample's files there")
    files = write_example_data(root, seed=args.seed)
    size = sum(f.stat().st_size for f in files)
    folders = sorted({f.relative_to(root).parts[0] for f in files})
    print(f"wrote {len(files)} files ({size / 1e6:.1f} MB) under {root}/: {', '.join(folders)}; the README's examples "
          f"read them as {root}/...")


def _run_export_onnx(args) -> None:
    from unmask.pipelines.export import ONNX_DIR, export_onnx

    model_dir, output_dir = Path(args.model), Path(args.output_dir or args.model)
    if not (model_dir / "config.json").is_file():
        raise UsageError(f"{model_dir}: not a model directory (no config.json)")
    if output_dir.resolve() != model_dir.resolve() and output_dir.exists() and any(output_dir.iterdir()) \
            and not args.overwrite:
        raise UsageError(f"{output_dir} is not empty: give an empty or new directory, the model directory itself "
                         "(the graph goes to its onnx/ folder), or --overwrite")
    report = export_onnx(model_dir, output_dir, int8=args.int8)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for name, outputs in report.items():
        if name == "head":
            continue
        agreement = ", ".join(f"{output} cosine {found['cosine']:.6f} (max |diff| {found['max_abs_diff']:.1e})"
                              for output, found in outputs.items())
        print(f"{output_dir / ONNX_DIR / name}: {agreement} against the PyTorch forward")


def _run_tokenizer_train(args) -> None:
    from unmask.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(args.files, args.vocab_size, lowercase=args.lowercase,
                                min_frequency=args.min_frequency, text_field=args.text_field,
                                model_max_length=args.model_max_length, output_dir=args.output_dir,
                                show_progress=sys.stderr.isatty())  # its bar draws blank lines into a log file
    print(f"trained a WordPiece tokenizer with {tokenizer.vocab_size:,} tokens -> {args.output_dir}")


_HELP = {
    "output_dir": "where the model, its checkpoints, metrics.jsonl and the loss curve are written",
    "per_device_train_batch_size": "training sequences per step on each process",
    "per_device_eval_batch_size": "sequences per forward pass when evaluating",
    "gradient_accumulation_steps": "micro-batches summed into one optimizer step (the global batch is per-device x "
                                   "processes x this)",
    "learning_rate": "peak learning rate (AdamW), reached after the warmup",
    "weight_decay": "AdamW weight decay, on matrices only (not biases and LayerNorm)",
    "adam_beta2": "AdamW's second-moment decay",
    "adam_epsilon": "AdamW's epsilon",
    "max_grad_norm": "clip the gradients' global norm to this",
    "max_steps": "optimizer steps to train (pretrain: default 1000, exclusive with --num_train_epochs)",
    "num_train_epochs": "passes over the training data (pretrain: over the token cache's sequences; sets the "
                        "steps, so not with --max_steps or --streaming)",
    "max_train_samples": "train on the first N packed sequences of the token cache (not with --streaming)",
    "warmup_steps": "steps of linear warmup from 0 to --learning_rate",
    "logging_steps": "write a metrics line (loss, learning rate, tokens/s) every this many steps",
    "eval_steps": "evaluate on --validation_file every this many steps (default: once, at the end)",
    "save_steps": "write a resumable checkpoint-N every this many steps (default: none)",
    "save_total_limit": "checkpoints kept; older ones are deleted",
    "seed": "random seed of initialisation, data order and masking",
    "show_progress": "a progress bar (plain lines when the output is not a terminal)",
    "vocab_size": "the size of the WordPiece tokenizer trained when no --tokenizer is given (default 30522)",
    "max_seq_length": "tokens per sequence, [CLS] and [SEP] included",
    "mlm_probability": "share of the tokens chosen for masking (BERT's 80/10/10 rule then applies)",
    "max_eval_samples": "evaluate on at most this many validation sequences (default: all)",
    "text_field": "the field that holds the text in JSONL, Parquet and Arrow files",
    "cache_dir": "where the token cache is written (default: ~/.cache/unmask)",
    "text_column": "the column of the (first) text",
    "text_pair_column": "pair: the column of the second text (default sentence2)",
    "label_column": "the column of the label (or score)",
    "regression": "classify / pair: predict a number (one output, mean squared error) instead of a label",
    "labels": "classify / pair / tag: every label, in id order, separated by commas (default: those of the "
              "training file, which must all occur in the validation file)",
    "corpus": "embed: a BEIR corpus.jsonl (_id, title, text) to train on, with --queries and --qrels (instead of "
              "--train_file)",
    "queries": "embed: BEIR queries.jsonl (_id, text)",
    "qrels": "embed: BEIR qrels TSV (query-id, corpus-id, score): each judged pair (score > 0) is a training pair",
    "mini_batch_tokens": "embed: gradient caching (GradCache): any --per_device_train_batch_size at the memory of "
                         "mini-batches of this many tokens, the same gradients (default: off)",
    "teacher": "embed: a cross-encoder (finetune pair) that scores each row's positive and negatives before "
               "training; its scores are distilled (a tuple table's label column can hold them instead)",
    "distillation": "embed, with a teacher's scores: margin_mse (MarginMSE) or kl (listwise KL), added to the "
                    "ranking loss, on 20 x cosine",
    "anchor_column": "embed / pair: the anchor (query) column of an (anchor, positive, negative...) table",
    "positive_column": "embed / pair: the positive column of such a table",
    "negative_columns": "embed / pair: its negative columns, separated by commas (default: every column whose name "
                        "starts with 'negative')",
    "in_batch_negatives": "pair on an (anchor, positive, negative...) table: each anchor's candidates also include "
                          "this many other rows' positives (sentence-transformers' cross-encoder "
                          "MultipleNegativesRankingLoss num_negatives)",
    "symmetric": "embed: the ranking loss also picks each positive's anchor among the batch's anchors (as "
                 "sentence-transformers' MultipleNegativesSymmetricRankingLoss)",
    "query_regularizer_weight": "sparse: FLOPS regularisation on the anchors' SPLADE vectors (keeps them sparse)",
    "document_regularizer_weight": "sparse: FLOPS regularisation on the documents' SPLADE vectors",
    "matryoshka_dims": "embed: add the loss at each of these leading dimensions, truncated and renormalised "
                       "(Matryoshka), e.g. 384,256,128,64",
    "label_scale": "regression: targets are divided by this (STS-B's 0-5 scores: 5)",
    "warmup_ratio": "share of the steps spent warming up (when --warmup_steps is 0)",
    "early_stopping_patience": "stop after this many evaluations without a better --validation_file metric "
                               "(default: train to the end; the best evaluated model is exported either way)",
    "train_file": "training text: files or globs (.txt, .jsonl, .parquet, .arrow, save_to_disk directories; .gz "
                  "or .zst compressed); repeatable",
    "validation_file": "held-out text for evaluation; repeatable",
    "model_config": "a new model: a preset (bert-tiny ... bert-large, modernbert-tiny ... modernbert-base) or a "
                    "config.json (default bert-mini unless --model_name_or_path)",
    "model_name_or_path": "continue from a model directory: an MLM, encoder, sentence-transformers, ELECTRA export "
                          "or classifier directory (its tokenizer too); a head it lacks is created new",
    "overwrite_output_dir": "start a new run in an --output_dir that holds files (its checkpoints, metrics and "
                            "trained tokenizer are removed first); without it such a directory is refused",
    "extend_vocab": "with --model_name_or_path: add up to N WordPiece pieces of the corpus that the vocabulary "
                    "lacks (new rows: the mean of their old pieces' embeddings)",
    "head_learning_rate": "peak learning rate of the head's own parameters (the MLM transform and bias, a "
                          "classifier), scheduled like --learning_rate; for a head created new on a trained encoder",
    "final_mlm_probability": "move the masking rate linearly from --mlm_probability to this over the steps",
    "lr_scheduler_type": "after warmup: linear, cosine, constant, or warmup_stable_decay (the peak held, then a "
                         "linear decay over the last --decay_ratio of the steps)",
    "decay_ratio": "warmup_stable_decay: the share of the post-warmup steps that decays",
    "tokenizer": "an HF tokenizer directory; without it a WordPiece tokenizer of --vocab_size is trained (with "
                 "--model_name_or_path: the directory's own, replaceable only by one with the same vocabulary)",
    "max_train_minutes": "wall-clock budget; the learning rate decays over whichever of it and --max_steps ends first",
    "resume_from_checkpoint": "a checkpoint-N directory, or 'latest' (newest complete one in --output_dir)",
    "cross_documents": "pack sequences across document boundaries (default: never cross)",
    "streaming": "read, tokenize and pack the training files while training (worker processes, a shuffle buffer; "
                 "memory bounded whatever the corpus size; the position is kept in checkpoints) instead of "
                 "tokenizing them into a cache first",
    "dataloader_num_workers": "--streaming: processes that read and tokenize (0: the training process itself)",
    "shuffle_buffer_size": "--streaming: packed sequences held and drawn from at random",
    "skip_bad_files": "--streaming: a file that cannot be read (damaged, not UTF-8, bad JSON) is named, the rest "
                      "of it dropped and counted, and training goes on; without it the run stops there",
    "whole_word_mask": "mask all pieces of a word together",
    "bf16": "bfloat16: training runs under autocast (fp32 master weights); serving casts the weights (fast on GPUs "
            "and CPUs with AVX512-BF16 or AMX)",
    "torch_compile": "compile the training step with torch.compile: the first steps take a minute or more; "
                     "pays on GPUs (BENCHMARKS.md)",
    "max_batch_tokens": "real tokens per forward pass: concurrent requests are packed up to it",
    "max_client_batch_size": "inputs per request",
    "forward_batch_size": "sequences per forward pass: the batched requests' inputs run length-sorted, this many "
                          "at a time",
    "max_input_length": "tokens per input (default and ceiling: the model's context)",
    "truncation": "for requests that do not send \"truncate\": true: refuse inputs longer than the context (error), "
                  "cut them (truncate), or read them in overlapping windows combined as offline (chunk: up to "
                  "--max_batch_tokens tokens an input; /embed, /predict, /rerank, /tag)",
    "auto_truncate": "TEI's name for --truncation truncate",
    "payload_limit": "bytes per request body",
    "served_model_name": "the model's name in /info and OpenAI answers (default: the directory's name)",
    "default_prompt_name": "a prompt of the model's config_sentence_transformers.json put before every input that "
                           "names none",
    "default_prompt": "a text put before every input that names no prompt",
    "max_concurrent_requests": "requests in flight at once; more are answered 429",
    "tokenization_workers": "threads that tokenize requests, beside the model's thread",
    "api_key": "require 'Authorization: Bearer KEY' on every route but GET /, /health, /ping and /metrics",
    "graceful_timeout": "seconds a SIGTERM waits for requests in flight, then the server exits",
    "max_fill_mask_answers": "fill-mask: masks x top_k per request (413 beyond)",
    "pooling": "an encoder's pooling (mean, cls, max; default: its directory's), or splade: serve a masked-LM "
               "directory's SPLADE vectors on /embed_sparse",
    "int8": "CPU only: int8 dynamically quantised linear layers, faster and slightly less accurate (BENCHMARKS.md)",
    "backend": "what runs the model: torch, or onnxruntime (its ONNX graph, exported once and kept in its onnx/ "
               "folder, in ONNX Runtime; needs pip install unmask[onnx]; BENCHMARKS.md says which is faster where)",
    "bf16_inference": "bfloat16 weights and activations: faster on GPUs and on CPUs with AVX512-BF16 or AMX "
                      "(outputs within bf16 rounding of fp32; BENCHMARKS.md)",
    "attn_backend": "attention: varlen (unpadded tokens, FlashAttention's varlen kernel on a GPU where installed) "
                    "or sdpa (a padded batch, masked (ModernBERT: with its sliding window), as transformers computes "
                    "it)",
    "objective": "mlm (masked-LM) or electra (generator + replaced-token detection; the export is the discriminator)",
    "generator_size": "electra: the generator's width as a fraction of the model's (1/4 to 1/2 usual)",
    "rtd_weight": "electra: loss = generator MLM + rtd_weight x replaced-token detection",
    "position_init": "BERT: start the learned position embeddings from a sin/cos table (sinusoidal: local "
                     "attention forms in far fewer steps, BENCHMARKS.md) or from noise as transformers does (normal)",
}


# the names transformers' example scripts use, accepted beside ours
_HF_ALIASES = {"tokenizer": ("--tokenizer_name",), "model_config": ("--config_name",)}


# where a command reads a field otherwise than _HELP says
_FINETUNE_HELP = {
    "train_file": "labelled training data: CSV / TSV with a header, or JSONL (classify, pair, embed); CoNLL "
                  "(tag: a token and its tag per line, blank lines between sentences)",
    "validation_file": "held-out data of the same format (embed: an STS file), evaluated after each epoch; the "
                       "best epoch is the exported model",
    "max_steps": "optimizer steps to train (0: --num_train_epochs over the training data)",
    "num_train_epochs": "passes over the training data (when --max_steps is 0)",
    "warmup_steps": "steps of linear warmup (0: --warmup_ratio of the steps)",
    "max_train_samples": "train on the first N examples of --train_file (default: all)",
    "max_eval_samples": "evaluate on the first N examples of --validation_file (default: all)",
}


_JSON_HELP = "print one JSON object instead of the readable line"


def _add_dataclass_flags(parser: argparse.ArgumentParser, cls, skip: tuple[str, ...] = (),
                         helps: dict[str, str] | None = None) -> None:
    """One snake_case flag per field of a dataclass of arguments; required when the field has no default."""
    texts = {**_HELP, **(helps or {})}
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flags, kind = [f"--{f.name}", *_HF_ALIASES.get(f.name, ())], str(f.type)
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        default = None if required else (f.default_factory() if f.default is dataclasses.MISSING else f.default)
        help_text = texts[f.name] + ("" if required or default in (None, []) else f" (default {default})")
        if kind == "bool":
            parser.add_argument(*flags, action=_Switch, default=default, help=help_text)
        elif kind.startswith("list"):
            parser.add_argument(*flags, action="extend", nargs="+", required=required, default=None, help=help_text)
        else:
            base = kind.split("|")[0].strip()
            convert = {"int": int, "float": float}.get(base, str)
            # a second data file would silently replace the first (other flags: the last wins, as in argparse)
            parser.add_argument(*flags, type=convert, required=required, default=default, help=help_text,
                                action=_Once if f.name.endswith("_file") else "store")


def _args_of(cls, args):
    fields = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in vars(args).items() if k in fields and v is not None})


def _model_for(command: str, task: str, path: str, int8: bool = False, bf16: bool = False, backend: str = "torch"):
    """(model, tokenizer) of a directory whose head fits `task`; any other head is refused by name
    (`heads.check_head`), never loaded with a head made up from random weights."""
    from unmask.hub import read_config
    from unmask.models import from_pretrained
    from unmask.tokenizer import load_tokenizer

    config = read_config(path)
    check_head(command, task, path, config.architectures)
    model = from_pretrained(path, TASK_HEADS[task], int8=int8, bf16=bf16, config=config, backend=backend)
    return model, load_tokenizer(path, model.config)


def _run_finetune(args) -> None:
    from unmask.train.args import FinetuneArgs
    from unmask.train.finetune import finetune

    print(json.dumps(finetune(_args_of(FinetuneArgs, args)), indent=2))


def _report(args, result: dict, line: str | None = None) -> None:
    """An evaluation's one-line summary with the time it took; with --json, the JSON alone on stdout and the time on
    stderr (a log keeps both)."""
    took = time.perf_counter() - args.started
    took = f"{took:.1f} s" if took < 120 else f"{took / 60:.1f} min"
    if getattr(args, "json", False):
        print(json.dumps(result))
        print(f"done in {took}", file=sys.stderr)
        return
    line = line or "  ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v:,}" for k, v in result.items()
                             if isinstance(v, (int, float)))  # per-type breakdowns: --json
    print(f"{line}  ({took})")


def _run_eval_task(args) -> None:
    from unmask.data.labelled import LabelledFormat, load_task_data
    from unmask.train.evaluate import evaluate_task

    model, tokenizer = _model_for(f"unmask eval {args.task}", args.task, args.model, **_inference(args))
    regression = model.config.num_labels == 1
    spec = LabelledFormat(task=args.task, text_column=args.text_column, text_pair_column=args.text_pair_column,
                          label_column=args.label_column, regression=regression, label_scale=args.label_scale,
                          max_seq_length=args.max_seq_length)
    data, _ = load_task_data(spec, tokenizer, args.file, None if regression else model.config.label2id)
    _report(args, evaluate_task(args.task, model, data, tokenizer.pad_token_id, args.batch_size, show_progress=True))


def _run_predict(args) -> None:
    from unmask.pipelines.classify import predict_classify, predict_rerank
    from unmask.pipelines.tag import predict_entities

    model, tokenizer = _model_for(f"unmask predict {args.task}", args.task, args.model, **_inference(args))
    long_inputs = {"truncation": args.truncation, "stride": args.stride}
    if args.task == "classify":
        result = predict_classify(model, tokenizer, args.texts, top_k=args.top_k, **long_inputs)
    elif args.task == "tag":
        result = predict_entities(model, tokenizer, args.texts, **long_inputs)
    else:
        if len(args.texts) < 2:
            raise UsageError("rerank needs a query and at least one document: predict rerank QUERY DOC [DOC ...]")
        result = predict_rerank(model, tokenizer, args.texts[0], args.texts[1:], **long_inputs)
    print(json.dumps(result if len(args.texts) > 1 or args.task == "rerank" else result[0]))


def _run_pretrain(args) -> None:
    from unmask.train.args import PretrainArgs
    from unmask.train.pretrain import pretrain

    print(json.dumps(pretrain(_args_of(PretrainArgs, args)), indent=2))


def _run_eval_mlm(args) -> None:
    from unmask.data.pretraining import PackedDataset, build_token_cache
    from unmask.io import cache_dir
    from unmask.train.evaluate import evaluate_mlm

    model, tokenizer = _model_for("unmask eval mlm", "fill-mask", args.model, **_inference(args))
    cache = build_token_cache(args.file, tokenizer, cache_dir("tokens"), args.text_field, show_progress=False)
    data = PackedDataset.from_cache(cache, tokenizer, args.max_seq_length)
    result = evaluate_mlm(model, data, tokenizer, args.batch_size, args.mlm_probability, args.max_samples,
                          seed=args.seed)
    _report(args, result, f"loss {result['loss']:.4f}  accuracy {result['accuracy']:.4f}  perplexity "
                          f"{result['perplexity']:.2f}  {result['tokens']:,} masked tokens")


def _run_fill_mask(args) -> None:
    from unmask.pipelines.fill_mask import fill_mask

    model, tokenizer = _model_for("unmask fill-mask", "fill-mask", args.model, **_inference(args))
    results = fill_mask(model, tokenizer, args.texts, top_k=args.top_k)
    if args.json:
        print(json.dumps(results[0] if len(args.texts) == 1 else results))
        return
    for text, result in zip(args.texts, results):
        print(text)
        for mask_number, candidates in enumerate(result if isinstance(result[0], list) else [result], start=1):
            shown = ", ".join(f"{c['token_str']} ({c['score']:.3f})" for c in candidates)
            print(f"  mask {mask_number}: {shown}")


def _run_embed(args) -> None:
    import numpy as np

    from unmask.data.readers import read_sentences
    from unmask.pipelines.embed import SentenceEncoder

    sentences = read_sentences(args.input)
    if args.sparse:
        return _embed_sparse(args, sentences)
    encoder = SentenceEncoder.from_pretrained(args.model, max_seq_length=args.max_seq_length, **_inference(args))
    vectors = encoder.encode(sentences, batch_size=args.batch_size, normalize=args.normalize,
                             truncation=args.truncation, stride=args.stride, dimensions=args.dimensions)
    np.save(args.output, vectors)
    _report(args, {}, f"{len(sentences):,} sentences -> {args.output} ({vectors.shape[0]} x {vectors.shape[1]}, "
                      "float32)")


def _embed_sparse(args, sentences: list[str]) -> None:
    """`embed --sparse`: SPLADE vectors of a masked-LM, one JSON object {vocabulary id: weight} per line."""
    from unmask.io import atomic_write_text
    from unmask.pipelines.sparse import sparse_encode

    if args.dimensions is not None or args.normalize:
        raise UsageError("--sparse writes SPLADE weights over the vocabulary: --dimensions and --normalize are for "
                         "dense vectors")
    model, tokenizer = _model_for("unmask embed --sparse", "sparse", args.model, **_inference(args))
    vectors = sparse_encode(model, tokenizer, sentences, batch_size=args.batch_size, truncation=args.truncation,
                            stride=args.stride, max_length=args.max_seq_length)
    atomic_write_text(args.output, "".join(json.dumps({str(i): round(w, 6) for i, w in vectors.as_dict(n).items()})
                                            + "\n" for n in range(len(vectors))))
    mean = len(vectors.values) / len(vectors)
    _report(args, {}, f"{len(sentences):,} sentences -> {args.output} (SPLADE, {mean:,.0f} non-zero weights each "
                      f"on average of {model.config.vocab_size:,})")


def _run_mine(args) -> None:
    from unmask.io import cache_dir
    from unmask.pipelines.embed import SentenceEncoder
    from unmask.pipelines.mine import mine_hard_negatives, write_rows

    encoder = SentenceEncoder.from_pretrained(args.model, **_inference(args))
    cross_encoder = (_model_for("unmask mine --cross_encoder", "rerank", args.cross_encoder, **_inference(args))
                     if args.cross_encoder else None)
    cache = args.cache_dir or cache_dir("vectors")
    rows, left_out = mine_hard_negatives(encoder, args.model, args.corpus, args.queries, args.qrels,
                                         args.num_negatives, args.range_min, args.range_max, args.margin,
                                         args.max_score, args.batch_size, cache, cross_encoder)
    write_rows(rows, args.output)
    _report(args, {}, f"{len(rows):,} rows of 1 positive and {args.num_negatives} negatives -> {args.output} "
                      f"({left_out:,} judged pairs left out: too few negatives passed the filters)")


def _run_eval_sts(args) -> None:
    from unmask.data.readers import read_sts
    from unmask.pipelines.embed import SentenceEncoder
    from unmask.train.evaluate import evaluate_sts

    encoder = SentenceEncoder.from_pretrained(args.model, **_inference(args))
    pairs = read_sts(args.file, args.sentence1_column, args.sentence2_column, args.score_column)
    _report(args, evaluate_sts(encoder, *pairs, batch_size=args.batch_size, dimensions=args.dimensions))


def _run_eval_retrieval(args) -> None:
    from unmask.train.evaluate import evaluate_bm25, evaluate_retrieval

    if args.bm25 and args.sparse:
        raise UsageError("--bm25 scores words without a model, --sparse a model's SPLADE vectors: give one")
    rerank = _reranker(args) if args.reranker else None
    if args.bm25:
        _report(args, evaluate_bm25(args.corpus, args.queries, args.qrels, rerank))
        return
    if args.sparse:
        from unmask.train.evaluate import evaluate_sparse_retrieval

        model, tokenizer = _model_for("unmask eval retrieval --sparse", "sparse", args.model, **_inference(args))
        _report(args, evaluate_sparse_retrieval(model, tokenizer, args.corpus, args.queries, args.qrels,
                                                batch_size=args.batch_size, truncation=args.truncation,
                                                stride=args.stride, rerank=rerank))
        return
    from unmask.pipelines.embed import SentenceEncoder

    encoder = SentenceEncoder.from_pretrained(args.model, **_inference(args))
    _report(args, evaluate_retrieval(encoder, args.corpus, args.queries, args.qrels, batch_size=args.batch_size,
                                     truncation=args.truncation, stride=args.stride, dimensions=args.dimensions,
                                     rerank=rerank))


def _reranker(args):
    """`eval retrieval --reranker`: the cross-encoder re-ordering each query's top --rerank_top_k."""
    from functools import partial

    from unmask.pipelines.classify import rerank_candidates

    if args.rerank_top_k < 1 or (args.reranker_max_length is not None and args.reranker_max_length < 2):
        raise UsageError("--rerank_top_k must be at least 1 and --reranker_max_length at least 2")
    model, tokenizer = _model_for("unmask eval retrieval --reranker", "rerank", args.reranker, **_inference(args))
    return partial(rerank_candidates, model, tokenizer, top_k=args.rerank_top_k, truncation=args.truncation,
                   max_length=args.reranker_max_length, batch_size=args.batch_size)


def _add_model(parser: argparse.ArgumentParser, what: str) -> None:
    """The model directory, given either way on every command: `unmask CMD MODEL ...` or `--model MODEL`
    (`--model_name_or_path` too, transformers' name); `_resolve_model` checks that one was given."""
    parser.add_argument("model_path", nargs="?", metavar="MODEL", help=f"{what} (or --model)")
    parser.add_argument("--model", "--model_name_or_path", dest="model", metavar="MODEL", help=f"{what}")


def _resolve_model(parser: argparse.ArgumentParser, args) -> None:
    """`args.model` from the positional or the flag. With the flag, a positional read as the model is the first
    text (`predict classify --model M "a text"`)."""
    if not hasattr(args, "model_path"):
        return
    if getattr(args, "bm25", False):  # BM25 reads no model
        if args.model or args.model_path:
            parser.error("--bm25 scores without a model: drop the model, or drop --bm25")
        return
    if args.model is None:
        if args.model_path is None:
            parser.error("the following arguments are required: MODEL (a model directory, or --model MODEL)")
        args.model = args.model_path
    elif args.model_path is not None:
        if not hasattr(args, "texts"):
            parser.error(f"the model is given twice ({args.model_path} and --model {args.model}): give it once")
        args.texts = [args.model_path, *args.texts]


def _add_inference_precision(parser: argparse.ArgumentParser) -> None:
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument("--int8", action="store_true", help=_HELP["int8"])
    choice.add_argument("--bf16", action="store_true", help=_HELP["bf16_inference"])
    parser.add_argument("--backend", choices=INFERENCE_BACKENDS, default="torch",
                        help=_HELP["backend"] + " (default torch)")


def _inference(args) -> dict:
    """How the command's models run: precision and backend (`_add_inference_precision`'s flags)."""
    return {"int8": args.int8, "bf16": args.bf16, "backend": args.backend}


def _add_beir(parser: argparse.ArgumentParser) -> None:
    """A BEIR dataset's three files (eval retrieval, mine)."""
    parser.add_argument("--corpus", required=True, help="BEIR corpus.jsonl (_id, title, text)")
    parser.add_argument("--queries", required=True, help="BEIR queries.jsonl (_id, text)")
    parser.add_argument("--qrels", required=True, help="BEIR qrels TSV (query-id, corpus-id, score)")


def _add_dimensions(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dimensions", type=int, default=None,
                        help="keep the leading N dimensions of each vector, renormalised (a model trained with "
                             "--matryoshka_dims; default: all)")


def _add_truncation(parser: argparse.ArgumentParser, limit: str) -> None:
    parser.add_argument("--truncation", choices=["chunk", "truncate", "error"], default="chunk",
                        help=f"inputs longer than {limit}: read them in overlapping windows and combine (chunk), "
                             "cut them with a warning (truncate), or refuse (error)")
    parser.add_argument("--stride", type=int, default=None,
                        help="chunk: tokens shared by neighbouring windows (default: a quarter of the window)")


def _add_setup_commands(commands) -> None:
    quickstart = commands.add_parser("quickstart", help="run the main job on embedded data (no download)")
    _add_demo_flags(quickstart)
    quickstart.add_argument("--output_dir", default="runs/quickstart", help="where the tiny model is written")
    quickstart.set_defaults(run=_run_quickstart)

    demo = commands.add_parser("demo", help="the masking lesson on synthetic data")
    _add_demo_flags(demo)
    demo.set_defaults(run=_run_demo)

    example = commands.add_parser("example-data", help="write a small generated sample of every file the README's "
                                  "examples read (books, SST-2, CoNLL, STS-B, BEIR layouts)")
    example.add_argument("output_dir", nargs="?", default="data", help="where to write it (default: data)")
    example.add_argument("--overwrite", action="store_true", help="write into a directory that is not empty")
    example.add_argument("--seed", type=int, default=0, help="seed of the generated texts")
    example.set_defaults(run=_run_example_data)

    export = commands.add_parser("export", help="export a model to another runtime's format")
    onnx = export.add_subparsers(dest="export_command", required=True).add_parser(
        "onnx", help="ONNX graphs for ONNX Runtime, in the layout sentence-transformers (backend='onnx') and optimum "
                     "load: OUTPUT_DIR/onnx/model.onnx beside the model's files")
    onnx.add_argument("model", metavar="MODEL", help="a model directory of any head unmask serves")
    onnx.add_argument("output_dir", metavar="OUTPUT_DIR", nargs="?",
                      help="where to write (default: the model directory itself)")
    onnx.add_argument("--int8", action="store_true",
                      help="also onnx/model_qint8.onnx: int8 weights (a scale per output channel), "
                           "activations quantised per call (ORT's quantize_dynamic)")
    onnx.add_argument("--overwrite", action="store_true", help="write into an OUTPUT_DIR that is not empty")
    onnx.add_argument("--json", action="store_true", help=_JSON_HELP)
    onnx.set_defaults(run=_run_export_onnx)

    tokenizer = commands.add_parser("tokenizer", help="tokenizer tools")
    tokenizer_commands = tokenizer.add_subparsers(dest="tokenizer_command", required=True)
    train = tokenizer_commands.add_parser("train", help="train a BERT WordPiece tokenizer")
    train.add_argument("files", nargs="+", help="text, .jsonl or .gz files, or globs")
    train.add_argument("--vocab_size", type=int, default=30522, help="pieces in the vocabulary (default 30522)")
    train.add_argument("--output_dir", required=True, help="the tokenizer directory to write (transformers' layout)")
    train.add_argument("--lowercase", action=_Switch, default=True,
                       help="lowercase and strip accents (uncased); --no_lowercase keeps case")
    train.add_argument("--min_frequency", type=int, default=2,
                       help="a piece must occur this often to enter the vocabulary (default 2)")
    train.add_argument("--text_field", default="text", help="the field holding the text in .jsonl files")
    train.add_argument("--model_max_length", type=int, default=512,
                       help="the longest input the tokenizer declares, in tokens (default 512)")
    train.set_defaults(run=_run_tokenizer_train)


def _add_training_commands(commands) -> None:
    from unmask.train.args import FinetuneArgs, PretrainArgs

    pretrain = commands.add_parser("pretrain", help="masked-LM pretraining from text files")
    _add_dataclass_flags(pretrain, PretrainArgs)
    pretrain.set_defaults(run=_run_pretrain)

    finetune = commands.add_parser("finetune", help="fine-tune a head: classify, tag, pair, embed or sparse")
    finetune.add_argument("task", choices=FINETUNE_TASKS, help="classify (a text -> a label), pair (two texts -> "
                          "a label or score), tag (a label per word), embed (sentence vectors from pairs), sparse "
                          "(SPLADE vectors from a masked-LM)")
    _add_model(finetune, "the encoder to fine-tune: ours, a transformers or a sentence-transformers directory "
                         "(sparse: a masked-LM directory)")
    _add_dataclass_flags(finetune, FinetuneArgs, skip=("task", "model"), helps=_FINETUNE_HELP)
    finetune.set_defaults(run=_run_finetune)


def _add_inference_commands(commands) -> None:
    predict = commands.add_parser("predict", help="predictions of a fine-tuned model")
    predict.add_argument("task", choices=PREDICT_TASKS, help="classify (labels of each text), tag (entities), "
                         "rerank (the query's relevance to each document)")
    _add_model(predict, "a fine-tuned model directory")
    predict.add_argument("texts", nargs="+", help="texts (rerank: the query, then the documents)")
    predict.add_argument("--top_k", type=int, default=1, help="classify: how many labels to return")
    _add_truncation(predict, "the model's context")
    _add_inference_precision(predict)
    predict.set_defaults(run=_run_predict)

    embed = commands.add_parser("embed", help="sentence embeddings of a text file (one sentence per line)")
    _add_model(embed, "a sentence-transformers or HF encoder directory")
    embed.add_argument("--input", required=True, help="UTF-8 text, one sentence per line")
    embed.add_argument("--output", required=True,
                       help="where the (N, H) float32 .npy goes (--sparse: JSONL, {vocabulary id: weight} a line)")
    embed.add_argument("--sparse", action="store_true",
                       help="SPLADE vectors from a masked-LM directory (finetune sparse) instead of dense ones")
    embed.add_argument("--batch_size", type=int, default=32, help="sentences per forward pass (default 32)")
    embed.add_argument("--normalize", action=_Switch, default=None,
                       help="L2-normalise (default: as the model directory says)")
    embed.add_argument("--max_seq_length", type=int, default=None,
                       help="tokens per window (default: the directory's max_seq_length)")
    _add_truncation(embed, "max_seq_length")
    _add_inference_precision(embed)
    _add_dimensions(embed)
    embed.set_defaults(run=_run_embed)

    mine = commands.add_parser("mine", help="hard negatives for a BEIR training set: the n-tuples finetune embed "
                               "and finetune pair read")
    _add_model(mine, "the sentence-transformers or HF encoder that ranks the corpus")
    _add_beir(mine)
    mine.add_argument("--output", required=True, help="where the JSONL rows (anchor, positive, negative_1...) go")
    mine.add_argument("--num_negatives", type=int, default=3, help="negatives per row (default 3)")
    mine.add_argument("--range_min", type=int, default=10,
                      help="skip the query's top N documents: likely unjudged positives (default 10)")
    mine.add_argument("--range_max", type=int, default=50, help="take negatives from ranks below this (default 50)")
    mine.add_argument("--margin", type=float, default=None,
                      help="drop a candidate whose cosine is above the positive's minus this (default: keep)")
    mine.add_argument("--max_score", type=float, default=None, help="drop a candidate whose cosine is above this")
    mine.add_argument("--cross_encoder", default=None,
                      help="rescore the candidates with this cross-encoder (finetune pair): --margin / --max_score "
                           "then read its relevance logits, the hardest are taken, and each row's label holds its "
                           "scores for distillation")
    mine.add_argument("--batch_size", type=int, default=64, help="texts per forward pass (default 64)")
    mine.add_argument("--cache_dir", default=None,
                      help="where the corpus vectors are kept for the next run (default: ~/.cache/unmask/vectors)")
    _add_inference_precision(mine)
    mine.set_defaults(run=_run_mine)

    fill = commands.add_parser("fill-mask", help="top-k fillers for each [MASK] in the text(s)")
    _add_model(fill, "a masked-LM directory")
    fill.add_argument("texts", nargs="+", help="text(s) with at least one [MASK]")
    fill.add_argument("--top_k", type=int, default=5, help="candidates per [MASK] (default 5)")
    fill.add_argument("--json", action="store_true", help="print the transformers pipeline's JSON shape")
    _add_inference_precision(fill)
    fill.set_defaults(run=_run_fill_mask)


def _add_eval_mlm(eval_commands) -> None:
    mlm = eval_commands.add_parser("mlm", help="masked-LM loss, accuracy and perplexity on a text file")
    _add_model(mlm, "a masked-LM directory")
    mlm.add_argument("--file", required=True, action="extend", nargs="+", help="text files or globs")
    mlm.add_argument("--max_seq_length", type=int, default=128, help="tokens per packed sequence (default 128)")
    mlm.add_argument("--mlm_probability", type=_probability, default=0.15,
                     help="share of the tokens masked (default 0.15)")
    mlm.add_argument("--batch_size", type=int, default=64, help="sequences per forward pass (default 64)")
    mlm.add_argument("--max_samples", type=int, default=None, help="evaluate at most this many sequences")
    mlm.add_argument("--text_field", default="text", help="the field of the text in JSONL files (default text)")
    mlm.add_argument("--seed", type=int, default=0, help="masking seed (fixed: comparable across models)")
    mlm.add_argument("--json", action="store_true", help=_JSON_HELP)
    _add_inference_precision(mlm)
    mlm.set_defaults(run=_run_eval_mlm)


def _add_eval_labelled(eval_commands) -> None:
    formats = {"classify": "CSV / TSV with a header, or JSONL: a text and a label per row",
               "pair": "CSV / TSV with a header, or JSONL: two texts and a label or score per row",
               "tag": "CoNLL: a token and its tag per line (the tag in the last column), blank lines between "
                      "sentences"}
    for task in LABELLED_TASKS:
        sub = eval_commands.add_parser(task, help=f"metrics of a fine-tuned {task} model on a labelled file",
                                       description=f"Metrics of a fine-tuned {task} model on a labelled file.")
        _add_model(sub, f"a fine-tuned {task} model directory")
        sub.add_argument("--file", required=True, help=f"the labelled file: {formats[task]}")
        sub.set_defaults(run=_run_eval_task, task=task, text_column="sentence", text_pair_column=None,
                         label_column="label", label_scale=1.0)
        if task != "tag":
            sub.add_argument("--text_column", default="sentence" if task == "classify" else "sentence1",
                             help="the column of the (first) text (default %(default)s)")
            sub.add_argument("--label_column", default="label", help="the column of the label (default label)")
        if task == "pair":
            sub.add_argument("--text_pair_column", default="sentence2",
                             help="the column of the second text (default sentence2)")
            sub.add_argument("--label_scale", type=float, default=1.0,
                             help="a regression model's scores are compared with the labels divided by this "
                                  "(STS-B: 5; default 1)")
        sub.add_argument("--max_seq_length", type=int, default=128,
                         help="tokens per input; longer ones are truncated (default 128)")
        sub.add_argument("--batch_size", type=int, default=64, help="inputs per forward pass (default 64)")
        sub.add_argument("--json", action="store_true", help=_JSON_HELP)
        _add_inference_precision(sub)


def _add_eval_embeddings(eval_commands) -> None:
    sts = eval_commands.add_parser("sts", help="Spearman / Pearson of embedding cosine against gold scores")
    _add_model(sts, "a sentence-transformers or HF encoder directory")
    sts.add_argument("--file", required=True,
                     help="the STS Benchmark release, or a CSV / TSV / JSONL file read with the column flags")
    sts.add_argument("--sentence1_column", default=None, help="(other formats) column of the first sentence")
    sts.add_argument("--sentence2_column", default=None, help="column of the second sentence (default sentence2)")
    sts.add_argument("--score_column", default=None, help="column of the gold score (default score)")
    sts.add_argument("--batch_size", type=int, default=64, help="sentences per forward pass (default 64)")
    sts.add_argument("--json", action="store_true", help=_JSON_HELP)
    _add_inference_precision(sts)
    _add_dimensions(sts)
    sts.set_defaults(run=_run_eval_sts)
    retrieval = eval_commands.add_parser("retrieval", help="BEIR-style retrieval: nDCG@10, recall@100, MRR@10")
    _add_model(retrieval, "a sentence-transformers or HF encoder directory")
    _add_beir(retrieval)
    retrieval.add_argument("--batch_size", type=int, default=64, help="texts per forward pass (default 64)")
    retrieval.add_argument("--json", action="store_true", help=_JSON_HELP)
    _add_truncation(retrieval, "the model's max_seq_length")
    _add_inference_precision(retrieval)
    _add_dimensions(retrieval)
    retrieval.add_argument("--bm25", action="store_true",
                           help="score BM25 (k1 0.9, b 0.4), the lexical baseline, instead of a model")
    retrieval.add_argument("--sparse", action="store_true",
                           help="score SPLADE vectors of a masked-LM directory (finetune sparse) through an "
                                "inverted index")
    retrieval.add_argument("--reranker", default=None, metavar="CROSS_ENCODER",
                           help="re-order each query's top --rerank_top_k with this cross-encoder (finetune pair); "
                                "the retriever's nDCG@10 and MRR@10 are reported beside")
    retrieval.add_argument("--rerank_top_k", type=int, default=100, help="documents re-ranked per query (100)")
    retrieval.add_argument("--reranker_max_length", type=int, default=None,
                           help="tokens of a (query, document) pair, the longer read per --truncation (default: "
                                "the reranker's context)")
    retrieval.set_defaults(run=_run_eval_retrieval)


def _add_serve_command(commands) -> None:
    from unmask.serve.options import ServeOptions

    serve = commands.add_parser("serve", help="an HTTP server (text-embeddings-inference's API) with dynamic batching")
    _add_model(serve, "a model directory: encoder / sentence-transformers (embed), ...ForSequenceClassification "
                      "(predict, rerank), ...ForMaskedLM (fill-mask), ...ForTokenClassification (tag)")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    serve.add_argument("--port", type=int, default=8080, help="the TCP port to listen on (default 8080)")
    _add_dataclass_flags(serve, ServeOptions)
    serve.add_argument("--log_level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                       help="uvicorn's log level (default info)")
    serve.set_defaults(run=_run_serve)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="unmask", description="Pretrain, fine-tune and serve BERT-style encoders.")
    parser.add_argument("--version", action="version", version=f"unmask {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    _add_setup_commands(commands)
    _add_training_commands(commands)
    _add_inference_commands(commands)
    eval_commands = commands.add_parser("eval", help="evaluate a model").add_subparsers(dest="eval_command",
                                                                                      required=True)
    _add_eval_mlm(eval_commands)
    _add_eval_labelled(eval_commands)
    _add_eval_embeddings(eval_commands)
    _add_serve_command(commands)
    return parser


def _run_serve(args) -> None:
    from unmask.serve.options import ServeOptions
    from unmask.serve.server import serve

    serve(args.model, args.host, args.port, _args_of(ServeOptions, args), args.log_level)


def _chosen_parser(parser: argparse.ArgumentParser, args) -> argparse.ArgumentParser:
    """The (sub)parser of the command `args` ran: `unmask eval sts` -> the `sts` parser."""
    while True:
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not actions or getattr(args, actions[0].dest, None) is None:
            return parser
        parser = actions[0].choices[getattr(args, actions[0].dest)]


class _Parser(argparse.ArgumentParser):
    """argparse, but a flag it does not know is named with the closest flags the command has, even where argparse
    would first complain about a missing required flag (`--modle x` means `--model` is missing)."""

    argv: list[str] = []

    def error(self, message: str):
        known = [option for action in self._actions for option in action.option_strings]
        unknown = [a.split("=")[0] for a in self.argv if a.startswith("--") and a.split("=")[0] not in known]
        if self._subparsers is None and unknown:  # a leaf command: its flags are all it takes
            spelled = {k.lstrip("-").replace("-", "_"): k for k in known}
            close = difflib.get_close_matches(unknown[0].lstrip("-").replace("-", "_"), spelled, n=2, cutoff=0.7)
            hint = f"did you mean {' or '.join(spelled[c] for c in close)}?" if close else f"see {self.prog} --help"
            message = f"unrecognized argument {unknown[0]}; {hint}"
        chosen = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if chosen:  # a misspelt command or task
            close = difflib.get_close_matches(chosen[1], re.findall(r"'([^']*)'", chosen[2]), n=1, cutoff=0.6)
            message += f"; did you mean {close[0]}?" if close else ""
        super().error(message)


def main(argv: list[str] | None = None) -> int:
    """The `unmask` command: a mistake a user can fix (an `UnmaskError`) prints one line and exits 2."""
    parser = build_parser()
    _Parser.argv = sys.argv[1:] if argv is None else list(argv)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        _chosen_parser(parser, args).error(f"unrecognized arguments: {' '.join(unknown)}")
    _resolve_model(_chosen_parser(parser, args), args)
    from unmask.runtime import bound_kernel_caches, keep_freed_memory

    keep_freed_memory()  # once, for the whole process: large tensors are reused, not page-faulted in again
    if getattr(args, "bf16", False) or getattr(args, "int8", False):  # before torch is imported: a oneDNN kernel
        bound_kernel_caches()  # per token count (bf16 matmuls, int8 ones on AMX) grew the process
    args.started = time.perf_counter()
    try:
        args.run(args)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at exit
    except (UnmaskError, FileNotFoundError) as e:
        print(f"unmask: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `unmask ... | head`: the reader left; say nothing more (Python's documented recipe)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
