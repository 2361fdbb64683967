"""The options of `unmask serve` (TEI's flag names where TEI has the flag), validated when made. Free of torch, so
that `unmask serve --help` answers at once."""

from __future__ import annotations

from dataclasses import dataclass

from unmask.config import POOLING_MODES, check_backend
from unmask.data.windows import TRUNCATION
from unmask.errors import UsageError

POOLINGS = (*POOLING_MODES, "splade")


@dataclass
class ServeOptions:
    max_batch_tokens: int = 16384  # real tokens per forward pass
    max_client_batch_size: int = 32  # inputs per request
    forward_batch_size: int = 32  # sequences per forward pass: a batch of requests runs length-sorted in such passes
    max_input_length: int | None = None  # tokens per input; default and ceiling: the model's context
    truncation: str = "error"  # for requests that do not send "truncate": true: error (413), truncate or chunk
    auto_truncate: bool = False  # TEI's name for --truncation truncate
    payload_limit: int = 2_000_000  # bytes per request body
    int8: bool = False  # CPU: int8 dynamically quantised linear layers (models/quantize.py)
    bf16: bool = False  # bfloat16 weights and activations (GPUs; CPUs with AVX512-BF16 or AMX)
    backend: str = "torch"  # or onnxruntime: the model's exported graph in ONNX Runtime (models/onnx.py)
    served_model_name: str | None = None  # the name /info and the OpenAI route give (default: the directory's)
    default_prompt_name: str | None = None  # a key of the model's sentence-transformers prompts, for every input
    default_prompt: str | None = None  # a text put before every input (exclusive with default_prompt_name)
    max_concurrent_requests: int = 512  # requests in flight at once; more are answered 429 (TEI's default)
    tokenization_workers: int = 2  # threads that tokenize and fit requests (the model has its own thread)
    api_key: str | None = None  # when set, model routes need "Authorization: Bearer <api_key>"
    graceful_timeout: float = 30.0  # seconds a SIGTERM waits for requests in flight before the process exits
    max_fill_mask_answers: int = 10_000  # fill-mask: masks x top_k over a request's inputs (413 beyond)
    pooling: str | None = None  # an encoder's: mean / cls / max (default: its directory's); splade: a masked LM's

    def __post_init__(self):
        if self.truncation not in TRUNCATION:
            raise UsageError(f"--truncation must be one of {', '.join(TRUNCATION)}, got {self.truncation!r}")
        if self.auto_truncate:
            if self.truncation == "chunk":
                raise UsageError("--auto_truncate (cut) and --truncation chunk (windows) exclude each other")
            self.truncation = "truncate"
        if self.int8 and self.bf16:
            raise UsageError("--int8 and --bf16 exclude each other: choose one")
        check_backend(self.backend, self.bf16)
        if self.pooling not in (None, *POOLINGS):
            raise UsageError(f"--pooling must be one of {', '.join(POOLINGS)}, got {self.pooling!r}")
        if self.graceful_timeout < 0:
            raise UsageError(f"--graceful_timeout cannot be negative, got {self.graceful_timeout}")
        if self.default_prompt_name is not None and self.default_prompt is not None:
            raise UsageError("--default_prompt_name and --default_prompt exclude each other: choose one")
        for name in ("max_batch_tokens", "max_client_batch_size", "forward_batch_size", "payload_limit",
                     "max_concurrent_requests", "tokenization_workers", "max_fill_mask_answers"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name} must be at least 1, got {getattr(self, name)}")
