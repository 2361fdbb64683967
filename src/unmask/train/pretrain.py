"""Pretraining: from text files to a model directory `transformers` loads as it is.

The model starts from random weights of a `--model_config`, or from a checkpoint people have
(`--model_name_or_path`: an MLM, encoder, sentence-transformers, ELECTRA-export or classifier directory; whatever
head the objective needs and the directory lacks is created new). Objectives: `mlm` (masked-LM, the model is
BertForMaskedLM / ModernBertForMaskedLM) or `electra` (replaced-token detection, objectives/electra.py; the export
is the discriminator encoder). Setup here (tokenizer, model, token cache, packing, dynamic-masking collator), the
steps in `train.loop`.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from unmask import hub
from unmask.config import load_config
from unmask.data.collate import MLMCollator
from unmask.data.pretraining import PackedDataset, build_token_cache
from unmask.data.streaming import TokenStream
from unmask.errors import UsageError
from unmask.heads import head_of
from unmask.io import atomic_write_text, cache_dir
from unmask.models import from_config, model_class, set_attn_backend
from unmask.models.bert import init_positions_sinusoidal
from unmask.objectives.electra import ElectraPretrainer
from unmask.tokenizer import Tokenizer, load_tokenizer, train_tokenizer
from unmask.train.args import PretrainArgs
from unmask.train.checkpoint import prepare_output_dir
from unmask.train.distributed import Distributed, init_distributed
from unmask.train.evaluate import evaluate_electra, evaluate_mlm
from unmask.train.loop import Evaluation, SampleOrder, train_loop
from unmask.train.vocabulary import extend_vocabulary


def prepare_tokenizer(args: PretrainArgs, dist: Distributed) -> Tokenizer:
    """The checkpoint's tokenizer (`--tokenizer` may replace it only with the same vocabulary), a given one, or one
    trained on the corpus."""
    if args.model_name_or_path:
        tokenizer = load_tokenizer(args.model_name_or_path, hub.read_config(args.model_name_or_path))
        if args.tokenizer:
            other = Tokenizer.from_pretrained(args.tokenizer)
            if other.backend.get_vocab() != tokenizer.backend.get_vocab():
                raise UsageError(f"--tokenizer {args.tokenizer}: its vocabulary differs from the one of "
                                 f"{args.model_name_or_path}, whose embeddings it would misread; drop --tokenizer")
            return other
        return tokenizer
    if args.tokenizer:
        return Tokenizer.from_pretrained(args.tokenizer)
    tokenizer_dir = Path(args.output_dir) / "tokenizer"
    if dist.is_main and not (tokenizer_dir / "tokenizer.json").exists():
        train_tokenizer(args.train_file, args.vocab_size, output_dir=tokenizer_dir, text_field=args.text_field,
                        model_max_length=args.max_seq_length,
                        show_progress=args.show_progress and sys.stderr.isatty())  # no blank lines in a log
    dist.barrier()
    return Tokenizer.from_pretrained(tokenizer_dir)


def new_model(args: PretrainArgs, tokenizer: Tokenizer):
    """Random weights of `--model_config`, with the tokenizer's vocabulary and special ids (ModernBERT's defaults
    belong to its own 50k vocabulary)."""
    config = load_config(args.model_config, vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_token_id,
                         cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id,
                         bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id)
    if args.objective == "electra":
        model = ElectraPretrainer(config, args.generator_size, args.rtd_weight)
    else:
        model = from_config(config, "masked-lm")
    if args.position_init == "sinusoidal":  # a resumed run loads its weights over it
        init_positions_sinusoidal(model, config.initializer_range)  # no effect on ModernBERT (rotary positions)
    return model


def continued_model(path: str, objective: str, generator_size: float, rtd_weight: float, show: bool = True):
    """The checkpoint in `path` under the head `objective` needs: its MLM head kept exactly when it has one, else
    a new one made as `transformers` makes it (decoder tied to the word embeddings); for ELECTRA, its encoder as the
    discriminator and a new generator. Says what was loaded and what was created."""
    config = hub.read_config(path)
    found = (config.architectures or [f"{config.model_type} encoder"])[0]
    if objective == "electra":
        model = ElectraPretrainer(config, generator_size, rtd_weight)
        hub.load_weights(model.discriminator, hub.read_weights(Path(path)), str(path))
        created = "a generator and a replaced-token detection head"
    else:
        model, new_keys = hub.load_pretrained(model_class(config.model_type, "masked-lm"), path, config)
        created = _describe_new(new_keys)
    model.train()
    if show:
        head = head_of(config.architectures)
        print(f"pretrain: starting from {path} ({found}: {head}): its encoder"
              f"{' and MLM head' if head == 'masked-lm' and objective == 'mlm' else ''} loaded; "
              f"created new: {created}", file=sys.stderr, flush=True)
    return model


def extend(model, tokenizer: Tokenizer, args: PretrainArgs, show: bool) -> Tokenizer:
    """`--extend_vocab`: the corpus's missing pieces added to the tokenizer and the model (train/vocabulary.py)."""
    tokenizer, pieces = extend_vocabulary(model, tokenizer, args.train_file, args.extend_vocab, args.text_field)
    if show:
        shown = ", ".join(pieces[:8]) + (" ..." if len(pieces) > 8 else "")
        print(f"pretrain: --extend_vocab added {len(pieces)} pieces of the corpus ({shown}); the embedding table has "
              f"{model.config.vocab_size} rows", file=sys.stderr, flush=True)
    return tokenizer


def _describe_new(new_keys: list[str]) -> str:
    if not new_keys:
        return "nothing"
    modules = sorted({key.rpartition(".")[0] for key in new_keys})
    return f"{', '.join(modules)} (the MLM head, decoder tied to the word embeddings)"


def packed(files: list[str], tokenizer, args: PretrainArgs, dist: Distributed, cross_documents: bool = False):
    """Rank 0 tokenizes (with a progress bar) while the others wait, then every rank opens the same cache."""
    cache_root = Path(args.cache_dir) if args.cache_dir else cache_dir("tokens")
    if dist.is_main:
        build_token_cache(files, tokenizer, cache_root, args.text_field, args.show_progress)
    dist.barrier()
    cache = build_token_cache(files, tokenizer, cache_root, args.text_field, show_progress=False)
    return PackedDataset.from_cache(cache, tokenizer, args.max_seq_length, cross_documents)


def training_data(tokenizer, args: PretrainArgs, dist: Distributed):
    """`take(step, n)`, the n training sequences of a step, and the stream behind it (None for the token cache).

    Cached: a seeded permutation per epoch, indexed by the step (a resumed run reads on where it stopped). Streamed
    (`--streaming`, data/streaming.py): this rank's stream, whose position the checkpoints keep."""
    if not args.streaming:
        data = packed(args.train_file, tokenizer, args, dist, args.cross_documents)
        count = min(len(data), args.max_train_samples or len(data))  # the first N sequences, as run_mlm.py takes
        if args.num_train_epochs is not None:  # transformers' way to say how long: passes over the data
            global_batch = args.per_device_train_batch_size * dist.world_size * args.gradient_accumulation_steps
            args.max_steps = max(1, math.ceil(args.num_train_epochs * count / global_batch))
        order = SampleOrder(count, args.seed)
        return (lambda step, count: [data[i] for i in order.take(step * count, count)]), None
    if args.dataloader_num_workers:
        # `tokenizers` turns its thread pool off in forked workers, and warns unless told: tell it
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    stream = TokenStream(args.train_file, tokenizer, args.max_seq_length, text_field=args.text_field,
                         cross_documents=args.cross_documents, rank=dist.rank, world_size=dist.world_size,
                         seed=args.seed, workers=args.dataloader_num_workers, buffer_size=args.shuffle_buffer_size,
                         skip_bad_files=args.skip_bad_files, show=args.show_progress)
    return (lambda step, count: stream.take(count)), stream


def pretrain(args: PretrainArgs) -> dict:
    """Pretrain with `args.objective`; returns the final metrics. The model is exported to `args.output_dir`."""
    dist = init_distributed()
    torch.manual_seed(args.seed)
    if dist.is_main:
        prepare_output_dir(Path(args.output_dir), resuming=bool(args.resume_from_checkpoint),
                           overwrite=args.overwrite_output_dir)
    dist.barrier()
    tokenizer = prepare_tokenizer(args, dist)
    if args.model_name_or_path:
        model = continued_model(args.model_name_or_path, args.objective, args.generator_size, args.rtd_weight,
                                show=dist.is_main)
        if args.extend_vocab:
            tokenizer = extend(model, tokenizer, args, show=dist.is_main)
    else:
        model = new_model(args, tokenizer)
    context = model.config.max_position_embeddings
    if args.max_seq_length > context:
        raise UsageError(f"--max_seq_length {args.max_seq_length} exceeds the model's max_position_embeddings "
                         f"{context}")
    set_attn_backend(model, args.attn_backend)
    take, stream = training_data(tokenizer, args, dist)
    valid_data = packed(args.validation_file, tokenizer, args, dist) if args.validation_file else None
    # cached, every rank collates the whole global step alike; streamed, each its own rows, with its own draws
    mask_seed = args.seed + 1_000_003 * dist.rank if stream is not None else args.seed
    collate = MLMCollator.from_tokenizer(tokenizer, mlm_probability=args.mlm_probability,
                                         whole_word_mask=args.whole_word_mask, seed=mask_seed)
    if dist.is_main:
        atomic_write_text(Path(args.output_dir) / "pretrain_args.json", json.dumps(asdict(args), indent=2) + "\n")

    def make_batch(step: int, size: int) -> dict[str, torch.Tensor]:
        collate.mlm_probability = masking_rate(args, step)
        return collate(take(step, size))

    def evaluate() -> dict:
        evaluate_objective = evaluate_electra if args.objective == "electra" else evaluate_mlm
        return evaluate_objective(model, valid_data, tokenizer, args.per_device_eval_batch_size,
                                  max_samples=args.max_eval_samples, bf16=args.bf16, device=dist.device)

    # the MLM head predicts at the masked positions only; ELECTRA's generator does so by itself
    sparse = {} if args.objective == "electra" else {"sparse_prediction": True}
    try:
        return train_loop(model, tokenizer, args, make_batch, dist,
                          evaluation=Evaluation(evaluate) if valid_data else None, generators=(collate.generator,),
                          model_kwargs=sparse, stream=stream)
    finally:
        if stream is not None:
            stream.close()


def masking_rate(args: PretrainArgs, step: int) -> float:
    """`--mlm_probability`, moving linearly to `--final_mlm_probability` over the steps when that is given (a high
    rate early, as ModernBERT and mmBERT schedule it). A function of the step alone, so a resumed run masks alike."""
    if args.final_mlm_probability is None:
        return args.mlm_probability
    progress = min(1.0, step / max(1, args.max_steps - 1))
    return args.mlm_probability + (args.final_mlm_probability - args.mlm_probability) * progress
