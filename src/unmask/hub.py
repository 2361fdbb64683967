"""Model directories in Hugging Face's layout: `config.json` + `model.safetensors` + tokenizer files.

Weights load only through safetensors, or `torch.load(weights_only=True)` for a legacy `pytorch_model.bin`: nothing
is ever unpickled. Every file is written atomically (`unmask.io`).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from unmask.config import (
    BertConfig,
    ModernBertConfig,
    config_from_dict,
    read_config_json,
)
from unmask.errors import CheckpointError, ConfigError, UsageError
from unmask.io import atomic_write, atomic_write_text

WEIGHTS_NAME = "model.safetensors"
LEGACY_WEIGHTS_NAME = "pytorch_model.bin"
# buffers some old checkpoints saved although they are derived (HF #6882); we rebuild them
DERIVED_KEYS = ("embeddings.position_ids", "embeddings.token_type_ids")


def _unique_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict with each shared tensor once, under its first name (tied decoder -> word embeddings)."""
    seen: set[int] = set()
    out = {}
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        out[name] = tensor.detach().contiguous()
    return out


def save_pretrained(model: torch.nn.Module, output_dir: str | Path, tokenizer=None) -> Path:
    if not all(isinstance(v, torch.Tensor) for v in model.state_dict().values()):
        raise UsageError("this model is int8-quantised for inference (--int8); save the float model it came from")
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    config = {**model.config.to_dict(), "architectures": [type(model).__name__]}
    atomic_write_text(output_dir / "config.json", json.dumps(config, indent=2) + "\n")
    tensors = {k: v.cpu() for k, v in _unique_state_dict(model).items()}
    atomic_write(output_dir / WEIGHTS_NAME, lambda tmp: save_file(tensors, str(tmp), metadata={"format": "pt"}))
    if tokenizer is not None:
        tokenizer.save_pretrained(output_dir)
    return output_dir


def read_config(path: str | Path) -> BertConfig | ModernBertConfig:
    """The config of a model directory, as the dataclass of its `model_type` (bert, modernbert)."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: model directory not found")
    config_file = path / "config.json"
    if not config_file.exists():
        raise CheckpointError(f"{config_file}: missing (not a model directory?)")
    try:
        return config_from_dict(read_config_json(config_file), str(config_file))
    except ConfigError as e:
        raise CheckpointError(f"{e}") from e
    except TypeError as e:  # a key of the wrong kind for the dataclass
        raise CheckpointError(f"{config_file}: {e}") from e


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    if (path / WEIGHTS_NAME).exists():
        try:
            return load_file(str(path / WEIGHTS_NAME))
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"{path / WEIGHTS_NAME}: corrupt or not a safetensors file ({e})") from e
    if (path / LEGACY_WEIGHTS_NAME).exists():
        try:  # weights_only: tensors and plain containers, never arbitrary pickled objects
            return torch.load(path / LEGACY_WEIGHTS_NAME, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - torch raises many types for a bad pickle
            raise CheckpointError(f"{path / LEGACY_WEIGHTS_NAME}: cannot be loaded safely ({e})") from e
    raise CheckpointError(f"{path}: no {WEIGHTS_NAME} (or {LEGACY_WEIGHTS_NAME})")


def weights_sha256(path: Path) -> str:
    """The SHA-256 of a directory's weights file (what keys the graphs exported from it)."""
    weights = next((path / name for name in (WEIGHTS_NAME, LEGACY_WEIGHTS_NAME) if (path / name).exists()), None)
    if weights is None:
        raise CheckpointError(f"{path}: no {WEIGHTS_NAME} (or {LEGACY_WEIGHTS_NAME})")
    digest = hashlib.sha256()
    with open(weights, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _align_prefix(state: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Map a bare encoder's keys onto a model with a head (`embeddings.` -> `bert.embeddings.`), and a headed
    checkpoint's encoder onto a bare encoder (`model.layers.` -> `layers.`)."""
    base = getattr(model, "base_model_prefix", None)
    expected = model.state_dict().keys()
    if base and not any(k.startswith(base + ".") for k in state):
        return {f"{base}.{k}": v for k, v in state.items()}
    if base is None and not any(k in expected for k in state):
        for prefix in ("bert.", "model.", "electra."):
            if any(k.startswith(prefix) and k[len(prefix):] in expected for k in state):
                return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    return state


def load_weights(model: torch.nn.Module, state: dict[str, torch.Tensor], source: str) -> list[str]:
    """Load `state` into `model`, checking keys and shapes; returns the head keys that were newly initialised."""
    state = {k: v for k, v in _align_prefix(state, model).items() if not k.endswith(DERIVED_KEYS)}
    expected = model.state_dict()
    # a tied alias (decoder.weight = word embeddings) may be absent from the file: HF drops it too
    present_ptrs = {expected[k].data_ptr() for k in state if k in expected}
    missing = [k for k in expected if k not in state and expected[k].data_ptr() not in present_ptrs]
    base = getattr(model, "base_model_prefix", None)
    # the pooler counts as a head: BertForMaskedLM (and ELECTRA) checkpoints have none, and a classifier fine-tuned
    # from them starts it fresh, as transformers does
    missing_base = [k for k in missing if (base is None or k.startswith(base + ".")) and "pooler." not in k]
    if missing_base:
        raise CheckpointError(f"{source}: missing encoder weights {missing_base[:5]}"
                              f"{' ...' if len(missing_base) > 5 else ''} (a different architecture?)")
    for key, tensor in state.items():
        if key in expected and tuple(tensor.shape) != tuple(expected[key].shape):
            raise CheckpointError(f"{source}: {key} has shape {tuple(tensor.shape)} but the config asks for "
                                  f"{tuple(expected[key].shape)}")
    state = {k: v for k, v in state.items() if k in expected}  # other tasks' heads are dropped
    model.load_state_dict(state, strict=False)
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    return [k for k in missing if k not in missing_base]


def load_pretrained(model_class, path: str | Path, config: BertConfig | ModernBertConfig | None = None,
                    **config_overrides) -> tuple[torch.nn.Module, list[str]]:
    """Build `model_class` from the directory's config (or `config`, read from it already) and load its weights;
    returns the model (in eval mode) and the keys the directory lacked, which were newly initialised (a new head)."""
    path = Path(path)
    config = config if config is not None else read_config(path)
    expected = getattr(model_class, "config_class", None)
    if expected is not None and not isinstance(config, expected):
        raise CheckpointError(f"{path}: a {config.model_type} model cannot be loaded as {model_class.__name__}; "
                              f"use unmask.models.from_pretrained(path, task)")
    for key, value in config_overrides.items():
        setattr(config, key, value)
    stream = torch.random.get_rng_state()
    model = model_class(config)  # draws every weight at random; the checkpoint overwrites all but a new head's
    new_keys = load_weights(model, read_weights(path), str(path))
    init_module = getattr(model, "init_module", None)
    if not new_keys or init_module is not None:
        # Loading moves the caller's random stream only by the new weights' draws, as in transformers (which
        # initialises only those): a seed then gives the same head, and the same dropout masks after it, as there,
        # whatever the encoder's size. A fine-tuning run hangs on its head's initial draw (BENCHMARKS.md).
        torch.random.set_rng_state(stream)
        _init_new(model, new_keys, init_module)
    model.eval()
    return model, new_keys


def _init_new(model: torch.nn.Module, new_keys: list[str], init_module) -> None:
    """Initialise the modules that hold new weights, keeping any loaded tensor they share: a new MLM head's decoder
    has a new bias but its weight is the loaded word-embedding matrix, which must survive the head's init."""
    modules = dict(model.named_modules())
    new = set(new_keys)
    for name in dict.fromkeys(key.rpartition(".")[0] for key in new_keys):
        module = modules[name]
        kept = {n: p.detach().clone() for n, p in module.named_parameters(recurse=False)
                if f"{name}.{n}" not in new}
        init_module(module)
        with torch.no_grad():
            for n, value in kept.items():
                getattr(module, n).copy_(value)


def from_pretrained(model_class, path: str | Path, config: BertConfig | ModernBertConfig | None = None,
                    **config_overrides):
    """`load_pretrained`, with a warning that names the weights the directory lacked."""
    model, new_keys = load_pretrained(model_class, path, config, **config_overrides)
    if new_keys:
        warnings.warn(f"{path}: no weights for {new_keys}; they are newly initialised (train them)", stacklevel=3)
    return model


class HubMixin:
    """`from_pretrained` / `save_pretrained` for the model classes (the work is in the functions above)."""

    @classmethod
    def from_pretrained(cls, path: str | Path, config=None, **config_overrides):
        return from_pretrained(cls, path, config, **config_overrides)

    def save_pretrained(self, output_dir: str | Path, tokenizer=None) -> Path:
        return save_pretrained(self, output_dir, tokenizer)
