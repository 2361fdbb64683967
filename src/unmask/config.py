"""Model configs: flat dataclasses whose fields are Hugging Face `config.json` keys, validated on construction."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from unmask.errors import ConfigError, UsageError


class HFConfig:
    """What every config dataclass shares: the `config.json` round trip. Keys we do not model are kept in `extra`
    and written back, so loading and saving a Hugging Face directory loses nothing."""

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in dataclasses.asdict(self).items() if k != "extra"}
        if data.get("id2label") is None:  # no task head: leave HF's defaults to HF
            for key in ["id2label", "label2id", "problem_type"]:
                data.pop(key, None)
        else:
            data["id2label"] = {str(k): v for k, v in data["id2label"].items()}  # JSON keys are strings
        if "classifier_dropout" in data and data["classifier_dropout"] is None:
            data.pop("classifier_dropout")
        return {**self.extra, **data}

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        kwargs = {k: v for k, v in data.items() if k in known}
        extra = {k: v for k, v in data.items() if k not in known and not k.startswith("_")}
        return cls(**kwargs, extra=extra)

    def to_json_file(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def from_json_file(cls, path: str | Path):
        return cls.from_dict(read_config_json(path))

    def _check_positive(self, *names: str) -> None:
        for name in names:
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                              f"{self.num_attention_heads}")
        pad = getattr(self, "pad_token_id", None)
        if pad is not None and not 0 <= pad < self.vocab_size:
            raise ConfigError(f"pad_token_id {pad} is not a row of the {self.vocab_size}-token embedding: "
                              "set vocab_size and pad_token_id together")

    def _normalise_labels(self) -> None:
        if self.id2label is not None:
            self.id2label = {int(k): v for k, v in self.id2label.items()}
            self.num_labels = len(self.id2label)
            if self.label2id is None:
                self.label2id = {v: k for k, v in self.id2label.items()}

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


def read_config_json(path: str | Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return data


@dataclass
class BertConfig(HFConfig):
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
        self._check_positive("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                             "intermediate_size", "max_position_embeddings", "type_vocab_size")
        if self.hidden_act not in ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu"):
            raise ConfigError(f"hidden_act {self.hidden_act!r} is not supported (gelu, gelu_new, relu)")
        if self.position_embedding_type != "absolute":
            raise ConfigError(f"position_embedding_type {self.position_embedding_type!r}: only 'absolute' is BERT's")
        for name in ["hidden_dropout_prob", "attention_probs_dropout_prob"]:
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        self._normalise_labels()


@dataclass
class ModernBertConfig(HFConfig):
    """ModernBERT (Warner et al., 2024): RoPE, GeGLU, pre-norm, no biases, local/global attention, 8k context."""

    model_type: str = "modernbert"
    vocab_size: int = 50368
    hidden_size: int = 768
    intermediate_size: int = 1152  # per GLU half: Wi projects to 2 x intermediate_size
    num_hidden_layers: int = 22
    num_attention_heads: int = 12
    hidden_activation: str = "gelu"
    max_position_embeddings: int = 8192
    initializer_range: float = 0.02
    initializer_cutoff_factor: float = 2.0
    norm_eps: float = 1e-5
    norm_bias: bool = False
    pad_token_id: int = 50283
    eos_token_id: int = 50282
    bos_token_id: int = 50281
    cls_token_id: int = 50281
    sep_token_id: int = 50282
    global_rope_theta: float = 160_000.0
    local_rope_theta: float = 10_000.0
    attention_bias: bool = False
    attention_dropout: float = 0.0
    global_attn_every_n_layers: int = 3  # layer i is global when i % n == 0, local (sliding window) otherwise
    local_attention: int = 128  # the whole window: a token sees local_attention // 2 tokens on each side
    embedding_dropout: float = 0.0
    mlp_bias: bool = False
    mlp_dropout: float = 0.0
    decoder_bias: bool = True
    classifier_pooling: str = "cls"
    classifier_dropout: float = 0.0
    classifier_bias: bool = False
    classifier_activation: str = "gelu"
    tie_word_embeddings: bool = True
    architectures: list[str] | None = None
    num_labels: int = 2
    id2label: dict[int, str] | None = None
    label2id: dict[str, int] | None = None
    problem_type: str | None = None
    layer_types: list[str] | None = None  # transformers >= 5 writes the pattern out; derived when absent
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.model_type != "modernbert":
            raise ConfigError(f"model_type {self.model_type!r} is not 'modernbert'")
        self._check_positive("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                             "intermediate_size", "max_position_embeddings", "global_attn_every_n_layers",
                             "local_attention")
        if self.head_dim % 2:
            raise ConfigError(f"head dimension {self.head_dim} must be even for rotary embeddings")
        if self.classifier_pooling not in ("cls", "mean"):
            raise ConfigError(f"classifier_pooling must be 'cls' or 'mean', got {self.classifier_pooling!r}")
        if self.layer_types is None:
            self.layer_types = ["full_attention" if i % self.global_attn_every_n_layers == 0 else "sliding_attention"
                                for i in range(self.num_hidden_layers)]
        if len(self.layer_types) != self.num_hidden_layers or not set(self.layer_types) <= {"full_attention",
                                                                                             "sliding_attention"}:
            raise ConfigError(f"layer_types must list full_attention / sliding_attention for each of the "
                              f"{self.num_hidden_layers} layers")
        self._normalise_labels()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModernBertConfig":
        data = dict(data)
        rope = data.pop("rope_parameters", None) or {}  # transformers >= 5 keeps the thetas here
        if "full_attention" in rope:
            data.setdefault("global_rope_theta", rope["full_attention"].get("rope_theta", 160_000.0))
        if "sliding_attention" in rope:
            data.setdefault("local_rope_theta", rope["sliding_attention"].get("rope_theta", 10_000.0))
        return super().from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        # both spellings, so transformers 4.x (the thetas) and 5.x (rope_parameters) read the same model
        data["rope_parameters"] = {"full_attention": {"rope_type": "default", "rope_theta": self.global_rope_theta},
                                   "sliding_attention": {"rope_type": "default", "rope_theta": self.local_rope_theta}}
        return data


CONFIG_CLASSES = {"bert": BertConfig, "modernbert": ModernBertConfig}
# the token poolings of a sentence-transformers `1_Pooling/config.json` that unmask reads
POOLING_MODES = ("mean", "cls", "max")
INFERENCE_BACKENDS = ("torch", "onnxruntime")  # what runs a model for inference (models.from_pretrained's backend)


def check_backend(backend: str, bf16: bool = False) -> None:
    if backend not in INFERENCE_BACKENDS:
        raise UsageError(f"backend must be one of {', '.join(INFERENCE_BACKENDS)}, got {backend!r}")
    if backend == "onnxruntime" and bf16:
        raise UsageError("bf16 runs on the torch backend only; the onnxruntime backend runs fp32 or int8 graphs")


def config_from_dict(data: dict[str, Any], source: str = "config") -> BertConfig | ModernBertConfig:
    model_type = data.get("model_type")
    if model_type not in CONFIG_CLASSES:
        raise ConfigError(f"{source}: model_type {model_type!r} is not supported ({', '.join(CONFIG_CLASSES)})")
    return CONFIG_CLASSES[model_type].from_dict(data)


def _bert(layers: int, hidden: int) -> dict[str, int]:
    # Turc et al. (2019) miniatures: heads = hidden / 64, feed-forward = 4 x hidden
    return {"num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": hidden // 64,
            "intermediate_size": 4 * hidden}


def _modernbert(layers: int, hidden: int, intermediate: int) -> dict[str, Any]:
    return {"model_type": "modernbert", "num_hidden_layers": layers, "hidden_size": hidden,
            "num_attention_heads": hidden // 64, "intermediate_size": intermediate}


PRESETS: dict[str, dict[str, Any]] = {
    "bert-tiny": _bert(2, 128),
    "bert-mini": _bert(4, 256),
    "bert-small": _bert(4, 512),
    "bert-medium": _bert(8, 512),
    "bert-base": _bert(12, 768),
    "bert-large": _bert(24, 1024),
    # ModernBERT keeps base's proportions (intermediate = 1.5 x hidden per GLU half) at the miniature sizes
    "modernbert-tiny": _modernbert(3, 128, 192),
    "modernbert-mini": _modernbert(6, 256, 384),
    "modernbert-small": _modernbert(9, 512, 768),
    "modernbert-base": _modernbert(22, 768, 1152),
}


def load_config(name_or_path: str | Path, **overrides) -> BertConfig | ModernBertConfig:
    """A preset name (`bert-mini`, `modernbert-base`) or a `config.json` path / model directory, with overrides."""
    name = str(name_or_path)
    if name in PRESETS:
        return config_from_dict({"model_type": "bert", **PRESETS[name], **overrides}, name)
    path = Path(name)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        raise ConfigError(f"{name}: neither a preset ({', '.join(PRESETS)}) nor a config file")
    data = read_config_json(path)
    data.setdefault("model_type", "bert")
    return config_from_dict({**data, **overrides}, str(path))
