"""ONNX export: a model directory -> the same directory with `onnx/model.onnx` (and `onnx/model_qint8.onnx`), the
layout sentence-transformers' `backend="onnx"` and optimum's `ORTModelFor...` load. The graphs themselves, their
check against the PyTorch forward and the manifest that lets the onnxruntime backend reuse them: models/onnx.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from unmask.heads import head_of
from unmask.hub import read_config
from unmask.models import from_pretrained
from unmask.models.onnx import ONNX_DIR, GraphModule, graph_key, require_onnxruntime, write_graphs, write_manifest
from unmask.pipelines.embed import SentenceEncoder


def load_for_export(model_dir: Path) -> GraphModule:
    """The directory's model for its head (`heads.head_of`), pooled and normalised as its layout says, in eval mode."""
    config = read_config(model_dir)
    head = head_of(config.architectures)
    if head == "encoder":
        encoder = SentenceEncoder.from_pretrained(model_dir, config=config)
        return GraphModule(encoder.model, head, encoder.pooling, encoder.normalize).eval()
    return GraphModule(from_pretrained(model_dir, head, config=config), head).eval()


def export_onnx(model_dir: str | Path, output_dir: str | Path, int8: bool = False) -> dict:
    """Write `output_dir` (the model directory's files, plus onnx/model.onnx and with `int8` onnx/model_qint8.onnx);
    returns what was written and each graph's agreement with the PyTorch forward on a ragged batch."""
    require_onnxruntime()
    model_dir, output_dir = Path(model_dir), Path(output_dir)
    module = load_for_export(model_dir)
    if output_dir.resolve() != model_dir.resolve():
        shutil.copytree(model_dir, output_dir, dirs_exist_ok=True, ignore=shutil.ignore_patterns(ONNX_DIR))
    report = write_graphs(module, output_dir / ONNX_DIR, int8)
    write_manifest(output_dir / ONNX_DIR, graph_key(output_dir, module.head, module.pooling, module.normalize), report)
    return report
