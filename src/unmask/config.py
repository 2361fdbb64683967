"""Model configs: flat dataclasses whose fields are Hugging Face `config.json` keys, validated on construction."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A config that cannot describe a model; the message names the field."""


@dataclass
class BertConfig:
    model_type: str = "bert"
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072  # 4 x hidden in every BERT preset
    hidden_act: str = "gelu"  # exact erf GELU, as BERT and HF use
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    position_embedding_type: str = "absolute"
    tie_word_embeddings: bool = True
    architectures: list[str] | None = None
    # task heads (HF keys): classification / tagging
    num_labels: int = 2
    id2label: dict[int, str] | None = None
    label2id: dict[str, int] | None = None
    problem_type: str | None = None
    classifier_dropout: float | None = None
    # keys we read but do not model are kept so a round trip does not lose them
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.model_type != "bert":
            raise ConfigError(f"model_type {self.model_type!r} is not 'bert'")
        for name in ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                     "max_position_embeddings", "type_vocab_size"]:
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                              f"{self.num_attention_heads}")
        if self.hidden_act not in ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu"):
            raise ConfigError(f"hidden_act {self.hidden_act!r} is not supported (gelu, gelu_new, relu)")
        if self.position_embedding_type != "absolute":
            raise ConfigError(f"position_embedding_type {self.position_embedding_type!r}: only 'absolute' is BERT's")
        for name in ["hidden_dropout_prob", "attention_probs_dropout_prob"]:
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.id2label is not None:
            self.id2label = {int(k): v for k, v in self.id2label.items()}
            self.num_labels = len(self.id2label)
            if self.label2id is None:
                self.label2id = {v: k for k, v in self.id2label.items()}

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in dataclasses.asdict(self).items() if k != "extra"}
        if data["id2label"] is None:  # no task head: leave HF's defaults to HF
            for key in ["id2label", "label2id", "problem_type"]:
                data.pop(key)
        else:
            data["id2label"] = {str(k): v for k, v in data["id2label"].items()}  # JSON keys are strings
        if data["classifier_dropout"] is None:
            data.pop("classifier_dropout")
        return {**self.extra, **data}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "BertConfig":
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        kwargs = {k: v for k, v in data.items() if k in known}
        extra = {k: v for k, v in data.items() if k not in known and not k.startswith("_")}
        return cls(**kwargs, extra=extra)

    def to_json_file(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def from_json_file(cls, path: str | Path) -> "BertConfig":
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path}: not valid JSON ({e})") from e
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a JSON object")
        return cls.from_dict(data)


def _bert(layers: int, hidden: int) -> dict[str, int]:
    # Turc et al. (2019) miniatures: heads = hidden / 64, feed-forward = 4 x hidden
    return {"num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": hidden // 64,
            "intermediate_size": 4 * hidden}


PRESETS: dict[str, dict[str, Any]] = {
    "bert-tiny": _bert(2, 128),
    "bert-mini": _bert(4, 256),
    "bert-small": _bert(4, 512),
    "bert-medium": _bert(8, 512),
    "bert-base": _bert(12, 768),
    "bert-large": _bert(24, 1024),
}


def load_config(name_or_path: str | Path, **overrides) -> BertConfig:
    """A preset name (`bert-mini`) or a `config.json` path / model directory, with field overrides."""
    name = str(name_or_path)
    if name in PRESETS:
        return BertConfig(**{**PRESETS[name], **overrides})
    path = Path(name)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        raise ConfigError(f"{name}: neither a preset ({', '.join(PRESETS)}) nor a config file")
    config = BertConfig.from_json_file(path)
    return dataclasses.replace(config, **overrides) if overrides else config
