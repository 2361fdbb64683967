"""ONNX graphs of our models, and ONNX Runtime (ORT) answering as the PyTorch model does.

A graph is our forward with padded attention (`attn_backend = "sdpa"`: one masked SDPA call a layer, a graph of
fixed shape), traced with dynamic batch and sequence axes. Inputs and outputs carry optimum's names (`input_ids`,
`attention_mask`, `token_type_ids` for BERT; `last_hidden_state` or `logits`); an encoder also outputs
`sentence_embedding`, pooled (and normalised) as its sentence-transformers layout says. Before a graph lands under
its name, ORT runs it on a ragged batch and it is compared with the PyTorch forward (the unpadded one).

`OnnxRuntimeModel` is called as the PyTorch model is and returns the same records, so every pipeline, and the
server's batching, runs on it unchanged. `onnxruntime_model` exports a directory's model once and keeps the graphs
beside it (`onnx/`, with a manifest keyed by the weights' SHA-256), or under the cache directory when the model's
folder is read-only or holds graphs that another tool wrote.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import warnings
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from unmask.errors import UsageError
from unmask.hub import weights_sha256
from unmask.io import atomic_write_text, cache_dir
from unmask.models.attention import set_attn_backend
from unmask.models.outputs import (
    IGNORE_INDEX,
    ClassifierOutput,
    EncoderOutput,
    MaskedLMOutput,
    check_inputs,
    classification_loss,
    mlm_loss,
)
from unmask.models.pooling import pool

ONNX_DIR = "onnx"
FP32_NAME, INT8_NAME = "model.onnx", "model_qint8.onnx"
DATA_SUFFIX = "_data"  # a graph over 2 GB keeps its weights in model.onnx_data (optimum's name)
MANIFEST = "unmask_export.json"
OPSET = 17
MIN_FP32_COSINE = 0.99999


def data_files(name: str) -> set[str]:
    """The names a graph's external weights can have beside it (ORT's quantiser names them `.data`)."""
    return {name + DATA_SUFFIX, name + ".data"}


def require_onnxruntime():
    try:
        import onnxruntime
        import onnxruntime.quantization  # noqa: F401  (imports onnx too)
    except ImportError:
        raise UsageError("ONNX export and the onnxruntime backend need onnx and onnxruntime: "
                         "pip install unmask[onnx]") from None
    return onnxruntime


class GraphModule(torch.nn.Module):
    """What is traced: tensors in, optimum's output names out (in `outputs` order)."""

    def __init__(self, model, head: str, pooling: str = "mean", normalize: bool = False):
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


def sample_inputs(config) -> dict[str, np.ndarray]:
    """A ragged batch of three sequences of seeded random ids (padding on two rows), int64 as ORT takes them."""
    lengths = torch.tensor([min(n, config.max_position_embeddings) for n in (24, 9, 3)])
    ids = torch.randint(0, config.vocab_size, (3, int(lengths[0])), generator=torch.Generator().manual_seed(0))
    mask = (torch.arange(int(lengths[0])) < lengths[:, None]).long()  # (3, T)
    inputs = {"input_ids": ids.masked_fill(mask == 0, config.pad_token_id or 0).numpy(), "attention_mask": mask.numpy()}
    if config.model_type == "bert":
        inputs["token_type_ids"] = np.zeros_like(inputs["input_ids"])
    return inputs


def write_graphs(module: GraphModule, onnx_dir: Path, int8: bool = False) -> dict:
    """`onnx_dir/model.onnx` (and with `int8`, `model_qint8.onnx`: int8 weights with a scale per output channel,
    activations quantised per call, as sentence-transformers' `export_dynamic_quantized_onnx_model` makes it with
    optimum's default configurations), each checked before it lands; returns each graph's agreement with the PyTorch
    forward.
    A fp32 graph that disagrees (cosine under 0.99999) is an error, never written."""
    onnxruntime = require_onnxruntime()
    onnx_dir.mkdir(parents=True, exist_ok=True)
    module.eval()  # a graph is for inference; torch's exporter would put back a training module's mode (dropout on)
    inputs = sample_inputs(module.model.config)
    expected = _torch_outputs(module, inputs)
    report = {"head": module.head}

    def trace_checked(staged: Path) -> None:
        _trace(module, inputs, staged)
        _gather_external_data(staged)
        report[FP32_NAME] = _agreement(staged, inputs, expected, module.outputs)
        if min(found["cosine"] for found in report[FP32_NAME].values()) < MIN_FP32_COSINE:
            raise RuntimeError(f"{onnx_dir / FP32_NAME}: the exported graph disagrees with the PyTorch forward "
                               f"({report[FP32_NAME]}); please report this")

    def quantize(staged: Path) -> None:
        logging.disable(logging.WARNING)  # its advice to pre-process the graph, logged on every call
        try:
            onnxruntime.quantization.quantize_dynamic(
                str(onnx_dir / FP32_NAME), str(staged), weight_type=onnxruntime.quantization.QuantType.QInt8,
                per_channel=True, use_external_data_format=(onnx_dir / (FP32_NAME + DATA_SUFFIX)).exists())
        finally:
            logging.disable(logging.NOTSET)
        report[INT8_NAME] = _agreement(staged, inputs, expected, module.outputs)

    _land(onnx_dir, FP32_NAME, trace_checked)
    if int8:
        _land(onnx_dir, INT8_NAME, quantize)
    else:  # an int8 graph left from earlier weights would no longer be theirs
        for stale in {INT8_NAME} | data_files(INT8_NAME):
            (onnx_dir / stale).unlink(missing_ok=True)
    return report


def _land(onnx_dir: Path, name: str, write: Callable[[Path], None]) -> None:
    """`write(path)` makes graph `name`, with any external-data file beside it, in a staging folder inside
    `onnx_dir`; then each file moves in by a rename, the graph last, so a crash never leaves a graph missing its
    weights. A data file of an earlier graph of that name (one over 2 GB) goes."""
    with tempfile.TemporaryDirectory(dir=onnx_dir, prefix=".staging-") as staging:
        graph = Path(staging) / name
        write(graph)
        data = [f for f in Path(staging).iterdir() if f != graph]
        for f in data:
            os.replace(f, onnx_dir / f.name)
        os.replace(graph, onnx_dir / name)
    for stale in data_files(name) - {f.name for f in data}:
        (onnx_dir / stale).unlink(missing_ok=True)


def _gather_external_data(graph: Path) -> None:
    """A graph over 2 GB (protobuf's limit) comes from torch's exporter with each weight in a file of its own beside
    it; gather them into one `model.onnx_data`, as optimum writes it (and sentence-transformers loads it)."""
    import onnx

    weights = [f for f in graph.parent.iterdir() if f != graph]
    if not weights:
        return
    proto = onnx.load(str(graph))  # reads every weight file
    onnx.save_model(proto, str(graph), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=graph.name + DATA_SUFFIX)
    del proto
    for f in weights:
        f.unlink()


def _torch_outputs(module: GraphModule, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    with torch.no_grad():
        out = module(*(torch.from_numpy(inputs[name]) for name in inputs))
    return [t.numpy() for t in (out if isinstance(out, tuple) else (out,))]


def _trace(module: GraphModule, inputs: dict[str, np.ndarray], path: Path) -> None:
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
    session = ort_session(path, threads=1)
    real = inputs["attention_mask"].astype(bool)
    found = {}
    for name, ours, theirs in zip(names, expected, session.run(names, inputs)):
        if ours.ndim == 3:  # (B, T, ...) per token: padding positions are not outputs
            ours, theirs = ours[real], theirs[real]
        norms = np.linalg.norm(ours, axis=-1) * np.linalg.norm(theirs, axis=-1)
        found[name] = {"cosine": float(((ours * theirs).sum(-1) / np.maximum(norms, 1e-12)).min()),
                       "max_abs_diff": float(np.abs(ours - theirs).max())}
    return found


def ort_session(path: Path, threads: int | None = None):
    """A session as ORT's users make one: full graph optimisation, the CPU provider, torch's thread count."""
    onnxruntime = require_onnxruntime()
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads or torch.get_num_threads()
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def write_manifest(onnx_dir: Path, key: dict, report: dict) -> None:
    atomic_write_text(onnx_dir / MANIFEST, json.dumps({**key, "graphs": report}, indent=2) + "\n")


def graph_key(model_dir: Path, head: str, pooling: str, normalize: bool) -> dict:
    """What a directory's graphs are made from: its weights (by SHA-256), the head, the pooling, the opset and the
    int8 graph's weight scales (per tensor before; a graph cached then is made again)."""
    return {"weights_sha256": weights_sha256(model_dir), "head": head, "pooling": pooling, "normalize": normalize,
            "opset": OPSET, "int8_weight_scales": "per-channel"}


def _read_manifest(onnx_dir: Path) -> dict:
    try:
        return json.loads((onnx_dir / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _graph_dir(model_dir: Path, key: dict) -> Path:
    """Beside the model (its `onnx/`) unless that folder holds graphs another tool wrote (never overwritten) or the
    model's folder is read-only: then under the cache directory, named by the key."""
    beside = model_dir / ONNX_DIR
    foreign = (beside / FP32_NAME).exists() and not (beside / MANIFEST).exists()
    if not foreign and os.access(beside if beside.is_dir() else model_dir, os.W_OK):
        return beside
    return cache_dir("onnx") / key["weights_sha256"][:20] / f"{key['head']}-{key['pooling']}-{key['normalize']}"


def onnxruntime_model(model_dir: str | Path, config, head: str, load: Callable[[], torch.nn.Module],
                      int8: bool = False, pooling: str = "mean", normalize: bool = False) -> "OnnxRuntimeModel":
    """The directory's model in ONNX Runtime: its cached graph (fp32, or with `int8` the quantised one), exported
    first (`load()` builds the PyTorch model) when none matches the weights."""
    require_onnxruntime()
    model_dir = Path(model_dir)
    key = graph_key(model_dir, head, pooling, normalize)
    onnx_dir = _graph_dir(model_dir, key)
    name = INT8_NAME if int8 else FP32_NAME
    manifest = _read_manifest(onnx_dir)
    made = {k: manifest.get(k) for k in key} == key and name in manifest.get("graphs", {})
    if not made or not (onnx_dir / name).exists():
        report = write_graphs(GraphModule(load(), head, pooling, normalize).eval(), onnx_dir, int8)
        write_manifest(onnx_dir, key, report)
    return OnnxRuntimeModel(onnx_dir / name, config, head)


class OnnxRuntimeModel:
    """An exported graph in an ORT session, called as the PyTorch model is, `model(input_ids, attention_mask,
    token_type_ids, labels=None, sparse_prediction=False)` with (B, T) tensors, and answering with the same records
    (a masked LM's sparse prediction: the logits at the labelled positions, or at every real token). Inference only."""

    training = False

    def __init__(self, path: Path, config, head: str):
        self.path, self.config, self.head = Path(path), config, head
        self.session = ort_session(self.path)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_name = "last_hidden_state" if head == "encoder" else "logits"

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                 sparse_prediction: bool = False, **_):
        check_inputs(self.config, input_ids)
        attention_mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        given = {"input_ids": input_ids, "attention_mask": attention_mask,
                 "token_type_ids": torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids}
        feed = {name: given[name].cpu().numpy().astype(np.int64, copy=False) for name in self.input_names}
        out = torch.from_numpy(self.session.run([self.output_name], feed)[0])  # (B, T, H) / (B, T, V) / (B, L)
        if self.head == "encoder":
            return EncoderOutput(out)
        if self.head == "masked-lm":
            return self._masked_lm(out, attention_mask, labels, sparse_prediction)
        loss = None if labels is None else classification_loss(out, labels, self.config.num_labels)
        return ClassifierOutput(loss, out)

    @staticmethod
    def _masked_lm(logits, attention_mask, labels, sparse_prediction: bool) -> MaskedLMOutput:
        loss = None if labels is None else mlm_loss(logits, labels)
        if not sparse_prediction:
            return MaskedLMOutput(loss, logits)
        positions = attention_mask.bool() if labels is None else labels != IGNORE_INDEX  # (B, T)
        return MaskedLMOutput(loss, logits[positions], positions)

    def parameters(self):
        return iter(())

    def eval(self) -> "OnnxRuntimeModel":
        return self

    def train(self, mode: bool = True) -> "OnnxRuntimeModel":
        if mode:
            raise UsageError("a model on the onnxruntime backend runs inference only; train the PyTorch model")
        return self
