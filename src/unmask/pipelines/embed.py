"""Sentence embeddings: an encoder, a pooling and an optional normalisation, in sentence-transformers' layout.

A sentence-transformers directory is an HF model directory (the encoder) plus `modules.json` (the pipeline:
Transformer -> Pooling -> Normalize), `1_Pooling/config.json` and `sentence_bert_config.json` (`max_seq_length`).
`SentenceEncoder.from_pretrained` reads that layout (classic and sentence-transformers 6 keys) or a bare HF encoder
directory; `save_pretrained` writes both at once, so `SentenceTransformer(dir)` and `AutoModel` read the result.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tokenizers import Encoding

from unmask.config import POOLING_MODES, check_backend
from unmask.data.windows import make_windows, mean_by_owner
from unmask.errors import CheckpointError, UsageError
from unmask.hub import load_weights, read_config, read_weights
from unmask.io import atomic_write_text
from unmask.models import for_inference, model_class
from unmask.models.bert import BertModel
from unmask.models.onnx import onnxruntime_model
from unmask.models.pooling import pool
from unmask.pipelines.batching import check_texts, run_batches
from unmask.tokenizer import load_tokenizer

_POOLING_FLAGS = {"mean": "pooling_mode_mean_tokens", "cls": "pooling_mode_cls_token",
                  "max": "pooling_mode_max_tokens"}
_NORMALIZE_TYPES = ("Normalize",)


def truncate_dimensions(vectors: np.ndarray, dimensions: int | None, normalize: bool) -> np.ndarray:
    """(N, H) -> (N, dimensions): the leading `dimensions` of each vector (Matryoshka), L2-normalised again when
    `normalize` (a unit vector's prefix is not a unit vector)."""
    if dimensions is not None:
        if not 1 <= dimensions <= vectors.shape[1]:
            raise UsageError(f"dimensions must be between 1 and the model's {vectors.shape[1]}, got {dimensions}")
        vectors = vectors[:, :dimensions]
    if normalize:
        vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    return vectors


def _read_json(path: Path) -> dict | list:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: cannot be read as JSON ({e})") from e


def read_sentence_transformers_layout(path: Path) -> dict:
    """Pooling, normalisation and max_seq_length from a sentence-transformers directory (None where absent)."""
    found = {"pooling": None, "normalize": False, "max_seq_length": None}
    if not (path / "modules.json").exists():
        return found
    modules = _read_json(path / "modules.json")
    for module in modules:
        kind = module.get("type", "").rsplit(".", 1)[-1]
        module_dir = path / module.get("path", "")
        if kind == "Pooling":
            config_file = module_dir / "config.json"
            if not config_file.exists():
                raise CheckpointError(f"{config_file}: missing (modules.json lists a Pooling module there)")
            config = _read_json(config_file)
            if "pooling_mode" in config:  # sentence-transformers >= 6
                found["pooling"] = config["pooling_mode"]
            else:
                found["pooling"] = next((m for m, flag in _POOLING_FLAGS.items() if config.get(flag)), None)
            if found["pooling"] not in POOLING_MODES:
                raise CheckpointError(f"{config_file}: pooling {found['pooling']!r} is not supported "
                                      f"({', '.join(POOLING_MODES)})")
        elif kind in _NORMALIZE_TYPES:
            found["normalize"] = True
        elif kind not in ("Transformer",):
            raise CheckpointError(f"{path / 'modules.json'}: module {kind!r} is not supported (Transformer, "
                                  "Pooling, Normalize)")
    if (path / "sentence_bert_config.json").exists():
        found["max_seq_length"] = _read_json(path / "sentence_bert_config.json").get("max_seq_length")
    return found


def _load_encoder(path: Path, config) -> torch.nn.Module:
    """The directory's encoder, fp32 (a BERT keeps its pooler only when the checkpoint has one)."""
    state = read_weights(path)
    stream = torch.random.get_rng_state()  # as models.from_pretrained: loading draws nothing from it
    if config.model_type == "bert":
        model = BertModel(config, add_pooling_layer=any(k.endswith("pooler.dense.weight") for k in state))
    else:
        model = model_class(config.model_type, "encoder")(config)
    load_weights(model, state, str(path))
    torch.random.set_rng_state(stream)
    return model


class SentenceEncoder:
    """Text -> vectors with an encoder, a pooling and optional L2 normalisation.

    Example:
        >>> encoder = SentenceEncoder.from_pretrained("all-MiniLM-L6-v2-dir")
        >>> vectors = encoder.encode(["A man is playing a guitar.", "Someone plays music."])  # (2, 384) float32
    """

    def __init__(self, model, tokenizer, pooling: str = "mean", normalize: bool = False,
                 max_seq_length: int | None = None):
        if pooling not in POOLING_MODES:
            raise UsageError(f"pooling must be one of {POOLING_MODES}, got {pooling!r}")
        if tokenizer.vocab_size > model.config.vocab_size:
            raise CheckpointError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model's embedding has "
                                  f"{model.config.vocab_size} rows: they do not belong together")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.pooling = pooling
        self.normalize = normalize
        limit = model.config.max_position_embeddings
        self.max_seq_length = min(int(max_seq_length or limit), limit)

    @classmethod
    def from_pretrained(cls, path: str | Path, pooling: str | None = None, normalize: bool | None = None,
                        max_seq_length: int | None = None, int8: bool = False, bf16: bool = False,
                        config=None, backend: str = "torch") -> "SentenceEncoder":
        """A sentence-transformers directory or a bare HF encoder directory (mean pooling unless told);
        `int8` / `bf16`: for faster inference (models.for_inference); vectors come back float32 either way;
        `backend="onnxruntime"`: the encoder's exported graph in ONNX Runtime (models/onnx.py);
        `config`: the directory's config when the caller has read it already."""
        path = Path(path)
        if not path.is_dir():
            raise CheckpointError(f"{path}: model directory not found")
        check_backend(backend, bf16)
        layout = read_sentence_transformers_layout(path)
        config = config if config is not None else read_config(path)
        if backend == "onnxruntime":
            model = onnxruntime_model(path, config, "encoder", lambda: _load_encoder(path, config), int8,
                                      layout["pooling"] or "mean", layout["normalize"])
        else:
            model = for_inference(_load_encoder(path, config), int8, bf16)
        tokenizer = load_tokenizer(path, config)
        length = max_seq_length or layout["max_seq_length"]
        if length is None and tokenizer.model_max_length < config.max_position_embeddings:
            length = tokenizer.model_max_length  # sentence-transformers 6 keeps it in tokenizer_config.json
        return cls(model, tokenizer, pooling or layout["pooling"] or "mean",
                   layout["normalize"] if normalize is None else normalize, length)

    @property
    def dimension(self) -> int:
        return self.model.config.hidden_size

    def tokenize(self, sentences: Sequence[str]) -> list[Encoding]:
        return self.tokenizer.encode_batch(check_texts(sentences, "sentence"))

    def encode(self, sentences: Sequence[str], batch_size: int = 32, normalize: bool | None = None,
               show_progress: bool | None = None, truncation: str = "chunk", stride: int | None = None,
               dimensions: int | None = None) -> np.ndarray:
        """(N, H) float32 embeddings, in input order. Batches are formed by token length, so little is padded.

        A sentence longer than max_seq_length is embedded as the mean of its windows' vectors (`truncation="chunk"`),
        cut to its first window with a warning ("truncate", what sentence-transformers does silently), or refused
        ("error"). `dimensions` keeps the leading ones of each vector (a Matryoshka-trained model), renormalised."""
        return self.encode_tokens(self.tokenize(sentences), batch_size, normalize, show_progress, truncation, stride,
                                  dimensions)

    def encode_tokens(self, encodings: Sequence[Encoding], batch_size: int = 32, normalize: bool | None = None,
                      show_progress: bool | None = None, truncation: str = "chunk",
                      stride: int | None = None, dimensions: int | None = None) -> np.ndarray:
        """`encode` for texts tokenized already (`tokenize`, or the server's encodings)."""
        windows = make_windows([(e.ids, e.type_ids) for e in encodings], self.max_seq_length, truncation, stride)

        def forward(input_ids, attention_mask, token_type_ids):
            hidden = self.model(input_ids, attention_mask).last_hidden_state  # (B, T, H)
            return pool(hidden, attention_mask, self.pooling).float().cpu().numpy()  # (B, H)

        show = len(windows) > 1000 if show_progress is None else show_progress
        vectors = np.stack(run_batches(self.model, windows.input_ids, forward, self.tokenizer.pad_token_id,
                                       batch_size, show_progress=show))
        if len(windows) > len(encodings):  # some sentences were read in several windows
            vectors = mean_by_owner(vectors, windows.owner, len(encodings))
        return truncate_dimensions(vectors, dimensions, self.normalize if normalize is None else normalize)

    def token_vectors(self, encodings: Sequence[Encoding], batch_size: int = 32) -> list[np.ndarray]:
        """The encoder's last hidden state of every token (special tokens included), one (T, H) array per input
        (each at most max_seq_length tokens: TEI's /embed_all)."""

        def forward(input_ids, attention_mask, token_type_ids):
            hidden = self.model(input_ids, attention_mask).last_hidden_state.float().cpu().numpy()  # (B, T, H)
            return [row[: int(n)] for row, n in zip(hidden, attention_mask.sum(1))]

        return run_batches(self.model, [e.ids for e in encodings], forward, self.tokenizer.pad_token_id, batch_size)

    def save_pretrained(self, output_dir: str | Path) -> Path:
        """An HF encoder directory that is also a sentence-transformers directory."""
        output_dir = Path(output_dir)
        self.model.save_pretrained(output_dir, tokenizer=self.tokenizer)
        modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
        if self.normalize:
            modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                            "type": "sentence_transformers.models.Normalize"})
            (output_dir / "2_Normalize").mkdir(exist_ok=True)
        atomic_write_text(output_dir / "modules.json", json.dumps(modules, indent=2) + "\n")
        (output_dir / "1_Pooling").mkdir(exist_ok=True)
        pooling = {"word_embedding_dimension": self.dimension,
                   **{flag: mode == self.pooling for mode, flag in _POOLING_FLAGS.items()},
                   "pooling_mode_mean_sqrt_len_tokens": False}
        atomic_write_text(output_dir / "1_Pooling" / "config.json", json.dumps(pooling, indent=2) + "\n")
        atomic_write_text(output_dir / "sentence_bert_config.json",
                          json.dumps({"max_seq_length": self.max_seq_length, "do_lower_case": False}, indent=2) + "\n")
        atomic_write_text(output_dir / "config_sentence_transformers.json",
                          json.dumps({"similarity_fn_name": "cosine"}, indent=2) + "\n")
        return output_dir
