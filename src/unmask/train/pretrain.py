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
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from unmask import hub
from unmask.config import load_config
from unmask.data.collate import MLMCollator
from unmask.data.pretraining import PackedDataset, build_token_cache
from unmask.data.streaming import TokenStream
from unmask.errors import UsageError
from unmask.heads import head_of
from unmask.io import atomic_write_text
from unmask.models import from_config, model_class, set_attn_backend
from unmask.models.bert import init_positions_sinusoidal
from unmask.objectives.electra import ElectraPretrainer
from unmask.tokenizer import Tokenizer, load_tokenizer, train_tokenizer
from unmask.train.checkpoint import prepare_output_dir
from unmask.train.distributed import Distributed, init_distributed
from unmask.train.evaluate import evaluate_electra, evaluate_mlm
from unmask.train.loop import Evaluation, SampleOrder, TrainingArgs, train_loop
from unmask.train.vocabulary import extend_vocabulary

OBJECTIVES = ("mlm", "electra")
POSITION_INITS = ("sinusoidal", "normal")


def default_cache_root() -> Path:
    return Path(os.environ.get("UNMASK_CACHE", Path.home() / ".cache" / "unmask")) / "tokens"


@dataclass(kw_only=True)
class PretrainArgs(TrainingArgs):
    train_file: list[str]
    validation_file: list[str] = field(default_factory=list)
    model_name_or_path: str | None = None  # a model directory to continue from (exclusive with model_config)
    model_config: str | None = None  # a preset name (bert-*, modernbert-*) or a config.json; default bert-mini
    overwrite_output_dir: bool = False  # a fresh run may write into a directory that holds another run's files
    extend_vocab: int | None = None  # with model_name_or_path: add up to this many of the corpus's WordPiece pieces
    objective: str = "mlm"  # mlm | electra
    generator_size: float = 0.25  # electra: the generator's width as a fraction of the discriminator's
    rtd_weight: float = 50.0  # electra: loss = MLM + rtd_weight x replaced-token detection
    position_init: str | None = None  # a new BERT's learned positions start from: sinusoidal (default) | normal
    tokenizer: str | None = None  # an HF tokenizer directory; None trains one with vocab_size
    vocab_size: int | None = None  # the tokenizer trained when none is given (default 30522)
    max_seq_length: int = 128
    mlm_probability: float = 0.15
    final_mlm_probability: float | None = None  # the masking rate moves linearly to this over the steps
    whole_word_mask: bool = False
    cross_documents: bool = False
    max_eval_samples: int | None = None
    text_field: str = "text"
    cache_dir: str | None = None
    streaming: bool = False  # read, tokenize and pack the training files while training, instead of a token cache
    dataloader_num_workers: int = 1  # streaming: processes that read and tokenize (0: the training process itself)
    shuffle_buffer_size: int = 10_000  # streaming: sequences held and drawn from at random
    skip_bad_files: bool = False  # streaming: drop the rest of a file that cannot be read, count it and go on

    def __post_init__(self):
        super().__post_init__()
        if self.model_config and self.model_name_or_path:
            raise UsageError("--model_config and --model_name_or_path exclude each other: give a preset or config "
                             "for a new model, or a directory to continue from")
        if self.model_name_or_path:
            for name in ("vocab_size", "position_init"):  # what only a new model or a new tokenizer uses
                if getattr(self, name) is not None:
                    raise UsageError(f"--{name} describes a new model; the one in --model_name_or_path has its own "
                                     "(--extend_vocab grows its vocabulary)")
        else:
            self.model_config = self.model_config or "bert-mini"
            self.position_init = "sinusoidal" if self.position_init is None else self.position_init
            self.vocab_size = 30522 if self.vocab_size is None else self.vocab_size
        if self.extend_vocab is not None and (not self.model_name_or_path or self.objective != "mlm"):
            raise UsageError("--extend_vocab extends the vocabulary of a checkpoint: it needs --model_name_or_path "
                             "and the mlm objective")
        if self.final_mlm_probability is not None and not 0.0 < self.final_mlm_probability < 1.0:
            raise UsageError(f"--final_mlm_probability must be in (0, 1), got {self.final_mlm_probability}")
        if self.max_steps < 1:
            raise UsageError(f"--max_steps must be at least 1, got {self.max_steps}")
        if not 0.0 < self.mlm_probability < 1.0:
            raise UsageError(f"--mlm_probability must be in (0, 1), got {self.mlm_probability}")
        if self.objective not in OBJECTIVES:
            raise UsageError(f"--objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        if self.dataloader_num_workers < 0 or self.shuffle_buffer_size < 1:
            raise UsageError("--dataloader_num_workers cannot be negative and --shuffle_buffer_size must be at least 1")
        if self.skip_bad_files and not self.streaming:
            raise UsageError("--skip_bad_files applies to --streaming; the token cache is built from readable files "
                             "only (the error names the file to fix or leave out)")
        if self.position_init not in (*POSITION_INITS, None):
            raise UsageError(f"--position_init must be one of {', '.join(POSITION_INITS)}, got {self.position_init!r}")


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
                        model_max_length=args.max_seq_length, show_progress=args.show_progress)
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
    cache_root = Path(args.cache_dir) if args.cache_dir else default_cache_root()
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
        order = SampleOrder(len(data), args.seed)
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
