"""The arguments of `unmask pretrain` and `unmask finetune` (flag names are HF TrainingArguments'), validated when
made. Plain dataclasses, free of torch, so that `unmask <command> --help` answers at once."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from unmask.errors import UsageError
from unmask.heads import FINETUNE_TASKS

SCHEDULES = ("linear", "cosine", "constant", "warmup_stable_decay")
OBJECTIVES = ("mlm", "electra")
POSITION_INITS = ("sinusoidal", "normal")
DISTILLATION_LOSSES = ("margin_mse", "kl")
BI_ENCODERS = ("embed", "sparse")  # finetune tasks trained contrastively on pairs and tuples


@dataclass(kw_only=True)
class TrainingArgs:
    """The loop's settings; the task's own arguments extend these (flag names are HF TrainingArguments')."""

    output_dir: str
    per_device_train_batch_size: int = 32
    per_device_eval_batch_size: int = 64
    gradient_accumulation_steps: int = 1
    learning_rate: float = 5e-4
    # the head's own parameters (outside the encoder) at this peak rate, scheduled alike; None: --learning_rate.
    # A head created new on a trained encoder learns faster at a higher rate than the encoder should move
    head_learning_rate: float | None = None
    weight_decay: float = 0.01
    adam_beta2: float = 0.98
    adam_epsilon: float = 1e-6  # BERT's pretraining value; fine-tuning uses HF's 1e-8
    max_grad_norm: float = 1.0
    max_steps: int = 1000
    max_train_minutes: float | None = None  # a wall-clock budget; the schedule decays over whichever ends first
    warmup_steps: int = 100
    lr_scheduler_type: str = "linear"
    decay_ratio: float = 0.1  # warmup_stable_decay: the last share of the (post-warmup) steps that decays
    bf16: bool = False
    torch_compile: bool = False  # compile the training forward (and so its backward): slow first steps, pays on GPUs
    attn_backend: str = "varlen"  # varlen (unpadded) or sdpa (padded, as transformers)
    logging_steps: int = 10
    eval_steps: int | None = None
    save_steps: int | None = None
    save_total_limit: int = 2
    seed: int = 42
    resume_from_checkpoint: str | None = None  # a checkpoint directory, or "latest" in output_dir
    overwrite_output_dir: bool = False  # a fresh run may write into a directory that holds another run's files
    show_progress: bool = True

    def __post_init__(self):
        for name in ["per_device_train_batch_size", "gradient_accumulation_steps", "logging_steps"]:
            if getattr(self, name) < 1:
                raise UsageError(f"--{name} must be at least 1, got {getattr(self, name)}")
        if self.max_steps < 0 or self.warmup_steps < 0:
            raise UsageError("--max_steps and --warmup_steps cannot be negative")
        if self.learning_rate < 0:  # 0 is a dry run: every step taken, no weight changed
            raise UsageError(f"--learning_rate cannot be negative, got {self.learning_rate}")
        if self.head_learning_rate is not None and (self.head_learning_rate < 0 or self.learning_rate == 0):
            raise UsageError("--head_learning_rate must be at least 0, with a --learning_rate above 0")
        if self.lr_scheduler_type not in SCHEDULES:
            raise UsageError(f"--lr_scheduler_type must be one of {', '.join(SCHEDULES)}, got "
                             f"{self.lr_scheduler_type!r}")
        if not 0.0 <= self.decay_ratio <= 1.0:
            raise UsageError(f"--decay_ratio must be in [0, 1], got {self.decay_ratio}")
        if self.attn_backend not in ("sdpa", "varlen"):
            raise UsageError(f"--attn_backend must be sdpa or varlen, got {self.attn_backend!r}")


@dataclass(kw_only=True)
class PretrainArgs(TrainingArgs):
    train_file: list[str]
    validation_file: list[str] = field(default_factory=list)
    model_name_or_path: str | None = None  # a model directory to continue from (exclusive with model_config)
    model_config: str | None = None  # a preset name (bert-*, modernbert-*) or a config.json; default bert-mini
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
    max_steps: int | None = None  # default 1000, or what --num_train_epochs makes it
    num_train_epochs: float | None = None  # passes over the token cache's sequences; sets max_steps
    max_train_samples: int | None = None  # train on the first N packed sequences of the cache
    text_field: str = "text"
    cache_dir: str | None = None
    streaming: bool = False  # read, tokenize and pack the training files while training, instead of a token cache
    dataloader_num_workers: int = 1  # streaming: processes that read and tokenize (0: the training process itself)
    shuffle_buffer_size: int = 10_000  # streaming: sequences held and drawn from at random
    skip_bad_files: bool = False  # streaming: drop the rest of a file that cannot be read, count it and go on

    def __post_init__(self):
        if self.num_train_epochs is not None or self.max_train_samples is not None:
            if self.streaming:
                raise UsageError("--num_train_epochs and --max_train_samples count the token cache's sequences; a "
                                 "stream has no length: give --max_steps with --streaming")
            if self.num_train_epochs is not None and (self.max_steps is not None or self.num_train_epochs <= 0):
                raise UsageError("--num_train_epochs (above 0) and --max_steps exclude each other: give one")
            if self.max_train_samples is not None and self.max_train_samples < 1:
                raise UsageError(f"--max_train_samples must be at least 1, got {self.max_train_samples}")
        if self.max_steps is None:  # pretrain sets it from the corpus when --num_train_epochs is given
            self.max_steps = 1 if self.num_train_epochs is not None else 1000
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


@dataclass(kw_only=True)
class FinetuneArgs(TrainingArgs):
    task: str
    model: str  # any encoder directory: ours, or a transformers / sentence-transformers one
    train_file: str | None = None  # or, for embed, a BEIR training set: corpus, queries, qrels
    corpus: str | None = None
    queries: str | None = None
    qrels: str | None = None
    validation_file: str | None = None
    text_column: str = "sentence"
    text_pair_column: str | None = None  # pair: the second text ("sentence2" when not given)
    label_column: str = "label"
    anchor_column: str = "anchor"  # embed / pair tuple tables: (anchor, positive, negative...) columns
    positive_column: str = "positive"
    negative_columns: str | None = None  # comma-separated; default every column whose name starts with "negative"
    in_batch_negatives: int = 4  # pair on tuple tables: other rows' positives ranked as each anchor's negatives
    regression: bool = False  # pair/classify: predict a number (num_labels = 1, MSE)
    label_scale: float = 1.0  # regression targets are divided by this (STS-B: 5)
    max_seq_length: int = 128
    num_train_epochs: float = 3.0
    warmup_ratio: float = 0.1
    early_stopping_patience: int | None = None
    max_train_samples: int | None = None  # the first N training examples
    max_eval_samples: int | None = None  # the first N validation examples
    labels: str | None = None  # classify / pair / tag: "neg,pos", every label in id order (default: the train file)
    matryoshka_dims: str | None = None  # embed: "384,256,128,64", the loss added at each leading dimension
    mini_batch_tokens: int | None = None  # embed: gradient caching, mini-batches of at most this many tokens
    teacher: str | None = None  # embed: a cross-encoder (finetune pair) whose scores of the tuples are distilled
    distillation: str = "margin_mse"  # embed, with teacher scores: margin_mse | kl, added to the ranking loss
    symmetric: bool = False  # embed: the ranking loss also picks each positive's anchor among the anchors
    query_regularizer_weight: float = 5e-5  # sparse: FLOPS weight on the anchors' SPLADE vectors
    document_regularizer_weight: float = 3e-5  # sparse: and on the documents' (sentence-transformers' SpladeLoss)
    # fine-tuning defaults differ from pretraining's
    learning_rate: float = 5e-5
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8  # HF's default: with fine-tuning's small gradients 1e-6 damps the updates
    warmup_steps: int = 0  # 0: warmup_ratio of the steps
    max_steps: int = 0  # 0: num_train_epochs over the training data
    logging_steps: int = 50

    @property
    def label_names(self) -> list[str]:
        """--labels as a list (empty: the training file's labels)."""
        return self.labels.split(",") if self.labels else []

    @property
    def dimensions(self) -> list[int]:
        """--matryoshka_dims as numbers (empty: the full vector only)."""
        return [int(d) for d in self.matryoshka_dims.split(",")] if self.matryoshka_dims else []

    def __post_init__(self):
        if self.task not in FINETUNE_TASKS:
            raise UsageError(f"task must be one of {', '.join(FINETUNE_TASKS)}, got {self.task!r}")
        beir = sum(path is not None for path in (self.corpus, self.queries, self.qrels))
        if beir not in (0, 3) or (self.train_file is None) == (beir == 0) or (beir and self.task not in BI_ENCODERS):
            raise UsageError("give --train_file, or (finetune embed / sparse) a BEIR training set: --corpus, "
                             "--queries and --qrels together")
        if self.num_train_epochs <= 0 and self.max_steps <= 0:
            raise UsageError("give --num_train_epochs or --max_steps")
        if not 0 <= self.warmup_ratio < 1:
            raise UsageError(f"--warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.matryoshka_dims is not None and (self.task != "embed" or not re.fullmatch(r"[1-9]\d*(,[1-9]\d*)*",
                                                                                    self.matryoshka_dims)):
            raise UsageError("--matryoshka_dims is for finetune embed: dimensions separated by commas, e.g. "
                             f"384,256,128,64; got {self.matryoshka_dims!r}")
        if self.mini_batch_tokens is not None and (self.task not in BI_ENCODERS or self.mini_batch_tokens < 1):
            raise UsageError(f"--mini_batch_tokens (gradient caching) is for finetune embed / sparse and at least 1, "
                             f"got {self.mini_batch_tokens}")
        if self.teacher is not None and self.task != "embed":
            raise UsageError("--teacher distils a cross-encoder into a dense bi-encoder: it is for finetune embed")
        if self.symmetric and self.task not in BI_ENCODERS:
            raise UsageError("--symmetric shapes a bi-encoder's ranking loss: it is for finetune embed / sparse")
        if self.task == "sparse" and self.validation_file:
            raise UsageError("finetune sparse does not validate during training: score the result with unmask eval "
                             "retrieval --sparse on held-out queries")
        if min(self.query_regularizer_weight, self.document_regularizer_weight) < 0:
            raise UsageError("--query_regularizer_weight and --document_regularizer_weight cannot be negative")
        if self.in_batch_negatives < 0:
            raise UsageError(f"--in_batch_negatives cannot be negative, got {self.in_batch_negatives}")
        if self.distillation not in DISTILLATION_LOSSES:
            raise UsageError(f"--distillation must be one of {', '.join(DISTILLATION_LOSSES)}, got "
                             f"{self.distillation!r}")
        names = self.label_names
        if self.labels is not None and (self.task in BI_ENCODERS or self.regression or not all(n.strip() for n in names)
                                        or len(set(names)) != len(names)):
            raise UsageError("--labels lists every label of a classify / pair / tag task once, separated by commas "
                             f"(e.g. neg,pos); got {self.labels!r}")
        for name in ("max_train_samples", "max_eval_samples"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise UsageError(f"--{name} must be at least 1, got {getattr(self, name)}")
        super().__post_init__()
