"""The onnxruntime backend: every pipeline answers on ONNX Runtime what it answers on PyTorch (1e-5), long inputs
included; the graph is exported once, kept beside the model under a manifest keyed by the weights' SHA-256, never
written over another tool's graph; the server answers through it as offline; without onnxruntime the error names
the install."""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest
import torch

from unmask.errors import UsageError
from unmask.hub import weights_sha256
from unmask.models import from_pretrained
from unmask.pipelines.classify import predict_classify, predict_rerank
from unmask.pipelines.embed import SentenceEncoder
from unmask.pipelines.fill_mask import fill_mask
from unmask.pipelines.sparse import sparse_encode
from unmask.pipelines.tag import predict_entities

onnxruntime = pytest.importorskip("onnxruntime", reason="pip install unmask[onnx]")
from unmask.models import onnx  # noqa: E402  (after the skip: it needs onnxruntime)

LONG = " ".join(["the old sailor remembered the lighthouse by the harbour before dawn"] * 30)  # > 128 tokens
TEXTS = [LONG, "a letter", "my neighbour celebrated the garden", "our teacher (again)."]
HEADS = {"embed": "encoder", "classify": "sequence-classification", "fill-mask": "masked-lm",
         "tag": "token-classification"}


@pytest.fixture(params=["bert", "modernbert"])
def copies(request, tmp_path, model_dirs, modernbert_dirs):
    """Each head's tiny model, copied: the backend writes its graph beside the model."""
    source = model_dirs if request.param == "bert" else modernbert_dirs
    return {task: shutil.copytree(path, tmp_path / task) for task, path in source.items()}


def both(path, task):
    return [from_pretrained(path, HEADS[task], backend=backend) for backend in ("torch", "onnxruntime")]


def assert_close(ours, theirs, what):
    assert type(ours) is type(theirs), what
    if isinstance(ours, dict):
        assert ours.keys() == theirs.keys(), what
        for key in ours:
            assert_close(ours[key], theirs[key], f"{what}.{key}")
    elif isinstance(ours, list):
        assert len(ours) == len(theirs), what
        for i, (a, b) in enumerate(zip(ours, theirs)):
            assert_close(a, b, f"{what}[{i}]")
    elif isinstance(ours, float):
        assert abs(ours - theirs) <= 1e-5, what
    else:
        assert ours == theirs, what


def test_every_pipeline_answers_the_same(copies, tokenizer):
    encoders = [SentenceEncoder.from_pretrained(copies["embed"], backend=b) for b in ("torch", "onnxruntime")]
    assert isinstance(encoders[1].model, onnx.OnnxRuntimeModel)
    for truncation in ("chunk", "truncate"):  # the long text is read in windows, or cut
        vectors = [e.encode(TEXTS, batch_size=2, truncation=truncation) for e in encoders]
        assert np.abs(vectors[0] - vectors[1]).max() <= 1e-5
    tokens = [e.token_vectors(e.tokenize(TEXTS[1:]), batch_size=2) for e in encoders]
    assert all(np.abs(a - b).max() <= 1e-5 for a, b in zip(*tokens))

    ours, theirs = both(copies["classify"], "classify")
    assert_close(*(predict_classify(m, tokenizer, TEXTS, top_k=2) for m in (ours, theirs)), "classify")
    assert_close(*(predict_rerank(m, tokenizer, "lighthouse", TEXTS) for m in (ours, theirs)), "rerank")
    ours, theirs = both(copies["tag"], "tag")
    assert_close(*(predict_entities(m, tokenizer, TEXTS) for m in (ours, theirs)), "tag")
    ours, theirs = both(copies["fill-mask"], "fill-mask")
    masked = ["the old [MASK] remembered the lighthouse", "a [MASK] for [MASK] teacher"]
    assert_close(*(fill_mask(m, tokenizer, masked, top_k=3) for m in (ours, theirs)), "fill-mask")
    sparse = [sparse_encode(m, tokenizer, TEXTS).dense() for m in (ours, theirs)]
    assert np.abs(sparse[0] - sparse[1]).max() <= 1e-5


def test_a_masked_lm_loss_and_a_classifier_loss_are_the_same(copies, tokenizer):
    ids = torch.tensor([tokenizer.encode_batch(["the old sailor remembered the lighthouse"])[0].ids])
    labels = torch.full_like(ids, -100)
    labels[0, 2:4] = ids[0, 2:4]
    outputs = [m(ids, torch.ones_like(ids), labels=labels, sparse_prediction=True)
               for m in both(copies["fill-mask"], "fill-mask")]
    assert torch.equal(outputs[0].predicted_positions, outputs[1].predicted_positions)
    assert abs(float(outputs[0].loss) - float(outputs[1].loss)) <= 1e-5
    outputs = [m(ids, torch.ones_like(ids), labels=torch.tensor([1])) for m in both(copies["classify"], "classify")]
    assert abs(float(outputs[0].loss) - float(outputs[1].loss)) <= 1e-5


def test_the_graph_is_exported_once_and_again_when_the_weights_change(tmp_path, model_dirs, monkeypatch):
    model = shutil.copytree(model_dirs["classify"], tmp_path / "model")
    first = from_pretrained(model, "sequence-classification", backend="onnxruntime", int8=True)
    manifest = json.loads((model / "onnx" / "unmask_export.json").read_text())
    assert first.path == model / "onnx" / "model_qint8.onnx" and (model / "onnx" / "model.onnx").is_file()
    assert manifest["weights_sha256"] == weights_sha256(model) and manifest["head"] == "sequence-classification"
    assert manifest["graphs"]["model.onnx"]["logits"]["cosine"] >= 0.99999

    def no_export(*args, **kwargs):
        raise AssertionError("exported again")

    monkeypatch.setattr(onnx, "write_graphs", no_export)
    from_pretrained(model, "sequence-classification", backend="onnxruntime")  # the cached graph
    monkeypatch.undo()

    changed = from_pretrained(model, "sequence-classification")
    with torch.no_grad():
        changed.classifier.bias += 1.0
    changed.save_pretrained(model)
    again = from_pretrained(model, "sequence-classification", backend="onnxruntime")
    ids = torch.tensor([[2, 40, 41, 42, 3]])
    with torch.no_grad():
        assert torch.allclose(again(ids).logits, changed.eval()(ids).logits, atol=1e-5)
    assert json.loads((model / "onnx" / "unmask_export.json").read_text())["weights_sha256"] == weights_sha256(model)
    # the int8 graph of the first weights went with them: asked for now, it is made from the new ones
    assert not (model / "onnx" / "model_qint8.onnx").exists()
    int8 = from_pretrained(model, "sequence-classification", backend="onnxruntime", int8=True)
    with torch.no_grad():
        assert torch.allclose(int8(ids).logits, changed(ids).logits, atol=0.1)  # int8 rounding; the bias moved 1.0


def test_the_int8_graph_has_a_weight_scale_per_output_channel_and_an_older_cache_is_made_again(tmp_path, model_dirs):
    import onnx as onnx_format

    model = shutil.copytree(model_dirs["embed"], tmp_path / "model")
    from_pretrained(model, "encoder", backend="onnxruntime", int8=True)
    graph = onnx_format.load(str(model / "onnx" / "model_qint8.onnx")).graph
    scales = {i.name: i.dims for i in graph.initializer if i.name.endswith("_scale")}
    weights = {i.name: i.dims for i in graph.initializer if i.name.endswith("_quantized") and ".layer." in i.name}
    assert len(weights) == 2 * 6 and all(len(dims) == 2 for dims in weights.values())  # 2 layers x 6 products
    for name, (rows, columns) in weights.items():  # (in, out): one scale per output column
        assert list(scales[name.removesuffix("_quantized") + "_scale"]) == [columns], name
    manifest_path = model / "onnx" / "unmask_export.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["int8_weight_scales"]  # as a session before per-channel scales wrote it
    manifest_path.write_text(json.dumps(manifest))
    (model / "onnx" / "model_qint8.onnx").write_bytes(b"a per-tensor graph")
    from_pretrained(model, "encoder", backend="onnxruntime", int8=True)
    assert json.loads(manifest_path.read_text())["int8_weight_scales"] == "per-channel"
    assert (model / "onnx" / "model_qint8.onnx").read_bytes() != b"a per-tensor graph"


def test_another_tools_graph_is_left_alone(tmp_path, model_dirs, monkeypatch):
    model = shutil.copytree(model_dirs["embed"], tmp_path / "model")
    (model / "onnx").mkdir()
    (model / "onnx" / "model.onnx").write_bytes(b"optimum's graph")
    monkeypatch.setenv("UNMASK_CACHE", str(tmp_path / "cache"))
    encoder = SentenceEncoder.from_pretrained(model, backend="onnxruntime")
    assert (model / "onnx" / "model.onnx").read_bytes() == b"optimum's graph"
    assert encoder.model.path.is_relative_to(tmp_path / "cache" / "onnx")
    reference = SentenceEncoder.from_pretrained(model).encode(TEXTS)
    assert np.abs(encoder.encode(TEXTS) - reference).max() <= 1e-5


def test_without_onnxruntime_or_with_bf16_the_error_says_what_to_do(model_dirs, monkeypatch):
    with pytest.raises(UsageError, match="bf16 runs on the torch backend only"):
        SentenceEncoder.from_pretrained(model_dirs["embed"], backend="onnxruntime", bf16=True)
    with pytest.raises(UsageError, match="backend must be one of torch, onnxruntime"):
        from_pretrained(model_dirs["tag"], "token-classification", backend="onnx")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime now raises ImportError
    with pytest.raises(UsageError, match=r"pip install unmask\[onnx\]"):
        from_pretrained(model_dirs["tag"], "token-classification", backend="onnxruntime")


def test_training_an_onnxruntime_model_is_refused(tmp_path, model_dirs):
    model = from_pretrained(shutil.copytree(model_dirs["tag"], tmp_path / "m"), "token-classification",
                            backend="onnxruntime")
    with pytest.raises(UsageError, match="inference only"):
        model.train()


def test_the_server_answers_through_onnxruntime_as_offline(tmp_path, model_dirs, server_class):
    model = shutil.copytree(model_dirs["embed"], tmp_path / "model")
    server = server_class(model, "--backend", "onnxruntime")
    try:
        status, vectors = server.call("POST", "/embed", {"inputs": TEXTS[1:], "normalize": False})
    finally:
        server.stop()
    assert status == 200 and (model / "onnx" / "model.onnx").is_file()
    offline = SentenceEncoder.from_pretrained(model).encode(TEXTS[1:], normalize=False)
    assert np.abs(np.array(vectors) - offline).max() <= 1e-5


def test_the_commands_take_the_backend(tmp_path, model_dirs, corpus_file, capsys, monkeypatch):
    from unmask.cli import main

    for variable in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):  # --bf16 sets them: put them back
        monkeypatch.delenv(variable, raising=False)
    model = shutil.copytree(model_dirs["fill-mask"], tmp_path / "model")

    def loss(*flags):
        assert main(["eval", "mlm", str(model), "--file", str(corpus_file), "--max_samples", "16",
                     "--max_seq_length", "64", "--json", *flags]) == 0
        return json.loads(capsys.readouterr().out)["loss"]

    assert abs(loss() - loss("--backend", "onnxruntime")) <= 1e-4
    assert main(["fill-mask", str(model), "a [MASK] letter", "--backend", "onnxruntime", "--bf16"]) == 2
    assert "bf16 runs on the torch backend only" in capsys.readouterr().err
