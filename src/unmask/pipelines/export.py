"""ONNX export: a model directory -> the same directory with `onnx/model.onnx` (and `onnx/model_qint8.onnx`), the
layout sentence-transformers' `backend="onnx"` and optimum's `ORTModelFor...` load.

The graph is our forward with padded attention (`attn_backend = "sdpa"`: one masked SDPA call a layer, a graph of
fixed shape), traced with dynamic batch and sequence axes. Inputs and outputs carry optimum's names (`input_ids`,
`attention_mask`, `token_type_ids` for BERT; `last_hidden_state` or `logits`); an encoder also outputs
`sentence_embedding`, pooled (and normalised) as its sentence-transformers layout says. At export the graph runs in
ONNX Runtime on a ragged batch and is compared with the PyTorch forward (the unpadded one, what unmask serves).
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import torch

from unmask.data.collate import pad_batch
from unmask.errors import UsageError
from unmask.heads import head_of
from unmask.hub import read_config
from unmask.models import from_pretrained, set_attn_backend
from unmask.pipelines.embed import SentenceEncoder, pool
from unmask.tokenizer import load_tokenizer

ONNX_DIR = "onnx"
FP32_NAME, INT8_NAME = "model.onnx", "model_qint8.onnx"
OPSET = 17
MIN_FP32_COSINE = 0.99999
_SAMPLE = ["A man is playing a guitar.", "Short.",
           "The quick brown fox jumps over the lazy dog while the band plays on and on into the night."]


def require_onnxruntime():
    try:
        import onnxruntime
        import onnxruntime.quantization  # noqa: F401  (imports onnx too)
    except ImportError:
        raise UsageError("ONNX export and the onnxruntime backend need onnx and onnxruntime: "
                         "pip install unmask[onnx]") from None
    return onnxruntime


class _Exported(torch.nn.Module):
    """The traced module: tensors in, optimum's output names out (in `outputs` order)."""

    def __init__(self, model, head: str, pooling: str | None, normalize: bool):
        super().__init__()
        self.model, self.head, self.pooling, self.normalize = model, head, pooling, normalize
        self.outputs = ["last_hidden_state", "sentence_embedding"] if head == "encoder" else ["logits"]

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        if self.head != "encoder":
            return self.model(input_ids, attention_mask, token_type_ids).logits  # (B, L) / (B, T, L) / (B, T, V)
        hidden = self.model(input_ids, attention_mask, token_type_ids).last_hidden_state  # (B, T, H)
        vectors = pool(hidden, attention_mask, self.pooling)  # (B, H)
        if self.normalize:
            vectors = torch.nn.functional.normalize(vectors, dim=-1)
        return hidden, vectors


def load_for_export(model_dir: Path) -> tuple[_Exported, object]:
    """The directory's model for its head (`heads.head_of`), in eval mode, and its tokenizer."""
    config = read_config(model_dir)
    head = head_of(config.architectures)
    if head == "encoder":
        encoder = SentenceEncoder.from_pretrained(model_dir, config=config)
        module = _Exported(encoder.model, head, encoder.pooling, encoder.normalize)
    else:
        module = _Exported(from_pretrained(model_dir, head, config=config), head, None, False)
    return module.eval(), load_tokenizer(model_dir, config)


def sample_inputs(tokenizer, model_type: str) -> dict[str, np.ndarray]:
    """A ragged batch of three texts (padding on two rows), int64 as ORT takes them."""
    ids, mask = pad_batch([e.ids for e in tokenizer.encode_batch(_SAMPLE)], tokenizer.pad_token_id)
    inputs = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
    if model_type == "bert":
        inputs["token_type_ids"] = np.zeros_like(inputs["input_ids"])
    return inputs


def export_onnx(model_dir: str | Path, output_dir: str | Path, int8: bool = False) -> dict:
    """Write `output_dir` (the model directory's files, plus onnx/model.onnx and with `int8` onnx/model_qint8.onnx);
    returns what was written and each graph's agreement with the PyTorch forward on a ragged batch."""
    onnxruntime = require_onnxruntime()
    model_dir, output_dir = Path(model_dir), Path(output_dir)
    module, tokenizer = load_for_export(model_dir)
    if output_dir.resolve() != model_dir.resolve():
        shutil.copytree(model_dir, output_dir, dirs_exist_ok=True, ignore=shutil.ignore_patterns(ONNX_DIR))
    (output_dir / ONNX_DIR).mkdir(parents=True, exist_ok=True)
    inputs = sample_inputs(tokenizer, module.model.config.model_type)
    expected = _torch_outputs(module, inputs)
    fp32, staged = output_dir / ONNX_DIR / FP32_NAME, output_dir / ONNX_DIR / f".{FP32_NAME}.tmp"
    _trace(module, inputs, staged)  # a graph lands under its name only whole and checked
    report = {"head": module.head, FP32_NAME: _agreement(staged, inputs, expected, module.outputs)}
    if min(found["cosine"] for found in report[FP32_NAME].values()) < MIN_FP32_COSINE:
        staged.unlink()
        raise RuntimeError(f"{fp32}: the exported graph disagrees with the PyTorch forward ({report[FP32_NAME]}); "
                           "please report this")
    os.replace(staged, fp32)
    if int8:  # dynamic quantisation as ORT's users run it: int8 weights, activations quantised per call
        quantized, staged = output_dir / ONNX_DIR / INT8_NAME, output_dir / ONNX_DIR / f".{INT8_NAME}.tmp"
        onnxruntime.quantization.quantize_dynamic(str(fp32), str(staged),
                                                  weight_type=onnxruntime.quantization.QuantType.QInt8)
        report[INT8_NAME] = _agreement(staged, inputs, expected, module.outputs)
        os.replace(staged, quantized)
    return report


def _torch_outputs(module: _Exported, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    with torch.no_grad():
        out = module(*(torch.from_numpy(inputs[name]) for name in inputs))
    return [t.numpy() for t in (out if isinstance(out, tuple) else (out,))]


def _trace(module: _Exported, inputs: dict[str, np.ndarray], path: Path) -> None:
    """Trace with padded attention (the unpadded path's shapes depend on the data), then put the backend back."""
    set_attn_backend(module, "sdpa")
    axes = {name: {0: "batch_size", 1: "sequence_length"} for name in inputs}
    axes["last_hidden_state" if module.head == "encoder" else "logits"] = (
        {0: "batch_size"} if module.head == "sequence-classification" else {0: "batch_size", 1: "sequence_length"})
    if module.head == "encoder":
        axes["sentence_embedding"] = {0: "batch_size"}
    try:  # traced with autograd on: under no_grad the activations run in place, which a trace does not record
        with torch.enable_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)  # the input checks read values: not in the graph
            torch.onnx.export(module, tuple(torch.from_numpy(inputs[name]) for name in inputs), str(path),
                              input_names=list(inputs), output_names=module.outputs, dynamic_axes=axes,
                              opset_version=OPSET, dynamo=False)
    finally:
        set_attn_backend(module, "varlen")


def _agreement(path: Path, inputs: dict[str, np.ndarray], expected: list[np.ndarray], names: list[str]) -> dict:
    """Each output of the graph against the PyTorch one at the real positions: the lowest cosine of a row (a token's
    or a sentence's vector) and the largest absolute difference."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    real = inputs["attention_mask"].astype(bool)
    found = {}
    for name, ours, theirs in zip(names, expected, session.run(names, inputs)):
        if ours.ndim == 3:  # (B, T, ...) per token: padding positions are not outputs
            ours, theirs = ours[real], theirs[real]
        norms = np.linalg.norm(ours, axis=-1) * np.linalg.norm(theirs, axis=-1)
        found[name] = {"cosine": float(((ours * theirs).sum(-1) / np.maximum(norms, 1e-12)).min()),
                       "max_abs_diff": float(np.abs(ours - theirs).max())}
    return found
