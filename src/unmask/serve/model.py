"""What `unmask serve` serves: a model directory, its tokenizer and the one task it answers.

`ServedModel.fit` turns a request's inputs into encodings that fit the context, off the batching thread. Its cost is
bounded by what it keeps, not by what it is sent: the tokenizer reads a window at the start of a text (its end for
`truncation_direction="left"`), doubled until the window holds one token more than fits, so a 1M-character input
with truncation costs about as much as a 1k-character one. Cuts are made on the token ids, as `tokenizers`
truncates (the kept tokens are those of the whole text: only tokens clear of the window's cut edge are kept).
`ServedModel.run` hands the encodings to the pipelines, on the batching thread.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from unmask import models
from unmask.config import POOLING_MODES
from unmask.errors import CheckpointError, UnmaskError, UsageError
from unmask.heads import SERVED_TASK, head_of
from unmask.hub import read_config
from unmask.pipelines.classify import window_logits
from unmask.pipelines.embed import SentenceEncoder, truncate_dimensions
from unmask.pipelines.fill_mask import fill_mask_tokens
from unmask.pipelines.sparse import splade_vectors
from unmask.pipelines.tag import entities_of
from unmask.serve.options import ServeOptions
from unmask.tokenizer import load_tokenizer

# the routes that answer for each served task (unmask.heads.SERVED_TASK)
ROUTES = {"embed": ("embed", "embed_all", "similarity", "embeddings"), "fill-mask": ("fill-mask",),
          "classify": ("predict", "rerank"), "tag": ("tag",)}
DIRECTIONS = ("right", "left")
_FIRST_WINDOW = 8  # characters of text read per token that may be kept, at first (the window doubles from there)
_WORD_END = re.compile(r"\S(?=\s)")  # the last character of a word followed by a space
_WORD_START = re.compile(r"\s(?=\S)")  # the space before a word


class ServeError(UnmaskError):
    """A request the server refuses: `status` and TEI's `error_type`."""

    def __init__(self, status: int, message: str, error_type: str = "Validation"):
        super().__init__(message)
        self.status, self.message, self.error_type = status, message, error_type


@dataclass
class TokenIds:
    """An input given as token ids (TEI's and OpenAI's `[int]` inputs): used as they are, special tokens included."""

    ids: list[int]

    @property
    def type_ids(self) -> list[int]:
        return [0] * len(self.ids)


def read_prompts(path: Path) -> dict[str, str]:
    """The `prompts` of a sentence-transformers directory (`config_sentence_transformers.json`), or none."""
    config = path / "config_sentence_transformers.json"
    if not config.exists():
        return {}
    prompts = json.loads(config.read_text()).get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
        raise CheckpointError(f"{config}: 'prompts' must map names to texts")
    return prompts


class ServedModel:
    """A model directory and the one thing it answers; `run` is called on the batching thread with many inputs."""

    def __init__(self, path: str | Path, options: ServeOptions | None = None):
        options = options or ServeOptions()
        self.path = Path(path)
        if not (self.path / "config.json").exists():
            raise CheckpointError(f"{self.path}: not a model directory (no config.json)")
        config = read_config(self.path)  # once: the head, the model and the tokenizer check all read it
        model_head = head_of(config.architectures)
        self.head = SERVED_TASK[model_head]
        self.name = options.served_model_name or self.path.name
        self.encoder = None
        if options.pooling == "splade" and self.head != "fill-mask":
            raise UsageError(f"--pooling splade needs a masked-LM directory; {self.path} is a {self.head} model")
        if options.pooling in POOLING_MODES and self.head != "embed":
            raise UsageError(f"--pooling {options.pooling} pools an encoder's vectors; {self.path} is a {self.head} "
                             "model")
        if self.head == "embed":
            self.encoder = SentenceEncoder.from_pretrained(self.path, pooling=options.pooling, int8=options.int8,
                                                           bf16=options.bf16, config=config, backend=options.backend)
            self.model, self.tokenizer = self.encoder.model, self.encoder.tokenizer
            context = self.encoder.max_seq_length
        else:
            self.model = models.from_pretrained(self.path, model_head, int8=options.int8, bf16=options.bf16,
                                                config=config, backend=options.backend).eval()
            self.tokenizer = load_tokenizer(self.path, config)
            context = self.model.config.max_position_embeddings
        if options.max_input_length is not None and options.max_input_length < 3:
            raise UsageError(f"--max_input_length must leave room for [CLS] and [SEP], got {options.max_input_length}")
        self.max_input_length = min(options.max_input_length or context, context)
        if self.encoder is not None:
            self.encoder.max_seq_length = self.max_input_length
        self.routes = ("embed_sparse", "fill-mask") if options.pooling == "splade" else ROUTES[self.head]
        self.forward_batch_size = options.forward_batch_size
        self.max_chunk_tokens = max(options.max_batch_tokens, self.max_input_length)  # an input read in windows
        self.prompts = read_prompts(self.path)
        self.default_prompt = options.default_prompt or ""
        if options.default_prompt_name is not None:
            self.default_prompt = self.prompt(options.default_prompt_name)
        self.dtype = "bfloat16" if options.bf16 else "int8" if options.int8 else "float32"

    def info(self) -> dict:
        config = self.model.config
        if self.head == "embed":
            kind = {"embedding": {"pooling": self.encoder.pooling, "dimension": self.encoder.dimension}}
        elif self.routes[0] == "embed_sparse":
            kind = {"embedding": {"pooling": "splade", "dimension": config.vocab_size}}
        elif self.head == "classify":
            id2label = config.id2label or {i: f"LABEL_{i}" for i in range(config.num_labels)}
            labels = {"id2label": {str(k): v for k, v in id2label.items()},
                      "label2id": {v: int(k) for k, v in id2label.items()}}
            kind = {"reranker" if config.num_labels == 1 else "classifier": labels}
        else:
            kind = {self.head: {"id2label": {str(k): v for k, v in config.id2label.items()}}
                    if self.head == "tag" else {}}
        return {"model_id": self.name, "model_sha": None, "model_dtype": self.dtype, "model_type": kind,
                "architecture": config.model_type, "max_input_length": self.max_input_length,
                "routes": list(self.routes), "prompts": sorted(self.prompts)}

    def prompt(self, name: str | None) -> str:
        """The text of a named prompt; the server's default prompt when no name is given."""
        if name is None:
            return self.default_prompt
        if name not in self.prompts:
            known = ", ".join(sorted(self.prompts)) or "none (its config_sentence_transformers.json has no prompts)"
            raise ServeError(422, f"prompt_name {name!r} is not one of the model's prompts: {known}")
        return self.prompts[name]

    # -- fitting inputs to the context (a worker thread, not the event loop) -----------------------------------

    def fit(self, items: list, mode: str = "error", direction: str = "right", prompt: str = "") -> list:
        """One encoding per input (text, (query, text) pair or `TokenIds`), within `max_input_length`: a longer
        input is refused (413, `mode` "error"), cut at its last segment's end (`direction` "left": its start) when
        `mode` is "truncate", or, when it is "chunk", kept whole up to `max_chunk_tokens` (`run` reads it in
        windows)."""
        if direction not in DIRECTIONS:
            raise ServeError(422, f"truncation_direction must be right or left, got {direction!r}")
        fitted = []
        for index, item in enumerate(items):
            if isinstance(item, TokenIds):
                fitted.append(self._fit_ids(index, item, mode, direction))
            else:
                item = (item[0], prompt + item[1]) if isinstance(item, tuple) else prompt + item
                fitted.append(self._fit_text(index, item, mode, direction))
        return fitted

    def _fit_ids(self, index: int, item: TokenIds, mode: str, direction: str) -> TokenIds:
        if not item.ids:
            raise ServeError(400, f"input {index} is empty", "Empty")
        vocabulary = self.model.config.vocab_size
        if not all(0 <= i < vocabulary for i in item.ids):
            raise ServeError(422, f"input {index}: token ids must lie in [0, {vocabulary})")
        limit = self.max_chunk_tokens if mode == "chunk" else self.max_input_length
        if len(item.ids) > limit:
            if mode != "truncate":
                raise ServeError(413, f"input {index} is {len(item.ids)} tokens, longer than the maximum of {limit}; "
                                      "send \"truncate\": true to cut it")
            return TokenIds(item.ids[:limit] if direction == "right" else item.ids[-limit:])
        return item

    def _fit_text(self, index: int, item, mode: str, direction: str):
        backend = self.tokenizer.backend
        query, text = item if isinstance(item, tuple) else (None, item)
        limit = self.max_chunk_tokens if mode == "chunk" else self.max_input_length
        room = limit - backend.num_special_tokens_to_add(query is not None)
        first = None
        if query is not None:
            first = self._window(query, room + 1, "right")
            if len(first.ids) >= room:
                raise ServeError(413, f"input {index}: its query alone fills the maximum of {limit} tokens")
            room -= len(first.ids)
        second = self._window(text, room + 1, direction)
        if len(second.ids) > room:
            if mode != "truncate":
                raise ServeError(413, f"input {index} is longer than the maximum of {limit} tokens; send "
                                      "\"truncate\": true to cut it")
            second.truncate(room, direction=direction)
        if not second.ids or (first is not None and not first.ids):
            raise ServeError(400, f"input {index} is empty (no tokens once normalised)", "Empty")
        return backend.post_process(first or second, second if first is not None else None)

    def _window(self, text: str, need: int, direction: str):
        """The encoding (no special tokens) of the whole `text`, or of a window at its start (`direction` right) or
        end that holds at least `need` tokens. A window ends (or starts) between a word and a space, so its tokens
        are exactly the whole text's; it doubles, stepping over runs of spaces, until it holds enough."""
        backend, size, n = self.tokenizer.backend, max(need * _FIRST_WINDOW, 1024), len(text)
        while size < n:
            if direction == "right":
                end = n - len(text[size:].lstrip())  # past the run of spaces at the edge, if any
                if end == n:  # only spaces follow: they hold no token (of a WordPiece vocabulary)
                    return backend.encode(text[:size], add_special_tokens=False)
                found = _WORD_END.search(text, end)
                if found is None:
                    break
                encoding, size = backend.encode(text[: found.start() + 1], add_special_tokens=False), found.start()
            else:
                start = len(text[: n - size].rstrip())
                if start == 0:
                    return backend.encode(text[n - size :], add_special_tokens=False)
                found = _last_match(_WORD_START, text, start)
                if found is None:
                    break
                encoding, size = backend.encode(text[found:], add_special_tokens=False), n - found
            if len(encoding.ids) >= need:
                return encoding
            size *= 2
        return backend.encode(text, add_special_tokens=False)

    # -- the forward passes (batching thread) ------------------------------------------------------------------

    def run(self, kind: str, inputs: list, options: tuple) -> list:
        """One result per input; `inputs` are (item, encoding) pairs, fitted already: an input longer than the
        context is one the server reads in overlapping windows (--truncation chunk), combined as offline."""
        items, encodings = [item for item, _ in inputs], [encoding for _, encoding in inputs]
        n, pad = self.forward_batch_size, self.tokenizer.pad_token_id
        if kind == "embed":
            return list(self.encoder.encode_tokens(encodings, n, normalize=False, show_progress=False,
                                                   truncation="chunk"))
        if kind == "embed_all":
            return self.encoder.token_vectors(encodings, n)
        if kind in ("predict", "rerank"):
            return list(window_logits(self.model, encodings, pad, "chunk", batch_size=n))
        if kind == "embed_sparse":
            vectors = splade_vectors(self.model, [e.ids for e in encodings], [e.type_ids for e in encodings], pad,
                                     batch_size=max(1, n // 4))
            return [vectors.as_dict(i) for i in range(len(vectors))]
        if kind == "fill-mask":
            return fill_mask_tokens(self.model, self.tokenizer, encodings, top_k=options[0], batch_size=n)
        if kind == "tag":
            return entities_of(self.model, items, encodings, pad, truncation="chunk", batch_size=n)
        raise ValueError(f"unknown kind {kind!r}")


def matryoshka(vectors: np.ndarray, dimensions: int | None, normalize: bool) -> np.ndarray:
    """`truncate_dimensions`, a dimension out of range answered 422."""
    try:
        return truncate_dimensions(vectors, dimensions, normalize)
    except UsageError as e:
        raise ServeError(422, str(e)) from e


def _last_match(pattern: re.Pattern, text: str, before: int) -> int | None:
    """Where the last match of `pattern` that starts before `before` starts (searched backwards a chunk at a time,
    so the cost is that of the chunks read)."""
    chunk = 4096
    while before > 0:
        begin = max(0, before - chunk)
        starts = [m.start() for m in pattern.finditer(text, begin, min(len(text), before + 1))]
        starts = [i for i in starts if i < before]
        if starts:
            return starts[-1]
        before, chunk = begin, chunk * 2
    return None
