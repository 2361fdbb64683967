"""ONNX export: for each head of each architecture, ONNX Runtime computes on the exported graph what our PyTorch
forward computes (1e-5), on batches of another size and length than the one traced; the files land where
sentence-transformers and optimum look; without onnxruntime the error names the install."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from unmask.data.collate import pad_batch
from unmask.errors import UsageError
from unmask.models import from_pretrained
from unmask.pipelines.embed import SentenceEncoder

onnxruntime = pytest.importorskip("onnxruntime", reason="pip install unmask[onnx]")
from unmask.pipelines.export import export_onnx  # noqa: E402  (after the skip: it needs onnxruntime)

HEADS = {"embed": "encoder", "classify": "sequence-classification", "fill-mask": "masked-lm",
         "tag": "token-classification"}
TEXTS = ["the old sailor remembered the lighthouse by the harbour before dawn, and the children painted a garden "
         "full of sunflowers while everyone slept", "a letter", "my neighbour celebrated", "our teacher (again).",
         "the committee misunderstood the 1887 railway timetable for 3.5 hours."]


def batch(tokenizer, with_types: bool) -> dict[str, np.ndarray]:
    """Five texts from 3 to 40 tokens, right-padded: another batch size and length than export's sample."""
    ids, mask = pad_batch([e.ids for e in tokenizer.encode_batch(TEXTS)], tokenizer.pad_token_id)
    inputs = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
    return {**inputs, "token_type_ids": np.zeros_like(inputs["input_ids"])} if with_types else inputs


def check_graph(model_dir, out, task, tokenizer):
    with_types = json.loads((model_dir / "config.json").read_text())["model_type"] == "bert"
    inputs = batch(tokenizer, with_types)
    assert inputs["input_ids"].shape[1] > 30
    session = onnxruntime.InferenceSession(str(out / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == list(inputs)
    real = inputs["attention_mask"].astype(bool)
    if task == "embed":
        hidden, vectors = session.run(["last_hidden_state", "sentence_embedding"], inputs)
        encoder = SentenceEncoder.from_pretrained(model_dir)
        assert np.abs(vectors - encoder.encode(TEXTS, batch_size=2)).max() <= 1e-5  # the user-facing vectors
        theirs = encoder.model(torch.from_numpy(inputs["input_ids"]), torch.from_numpy(inputs["attention_mask"]))
        assert np.abs(hidden[real] - theirs.last_hidden_state.detach().numpy()[real]).max() <= 1e-5
        return
    (logits,) = session.run(["logits"], inputs)
    model = from_pretrained(model_dir, HEADS[task]).eval()
    with torch.no_grad():
        expected = model(*(torch.from_numpy(a) for a in inputs.values())).logits.numpy()
    assert logits.shape == expected.shape
    if logits.ndim == 3:  # per token: padding positions are no output
        logits, expected = logits[real], expected[real]
    assert np.abs(logits - expected).max() <= 1e-5, task


@pytest.mark.parametrize("task", list(HEADS))
def test_the_bert_graph_computes_our_forward(tmp_path, model_dirs, tokenizer, task):
    report = export_onnx(model_dirs[task], tmp_path / "out")
    assert report["head"] == HEADS[task] and all(found["cosine"] >= 0.99999 for found in report["model.onnx"].values())
    check_graph(model_dirs[task], tmp_path / "out", task, tokenizer)
    assert (tmp_path / "out" / "config.json").is_file() and (tmp_path / "out" / "tokenizer.json").is_file()


@pytest.mark.parametrize("task", list(HEADS))
def test_the_modernbert_graph_computes_our_forward(tmp_path, modernbert_dirs, tokenizer, task):
    export_onnx(modernbert_dirs[task], tmp_path / "out")
    check_graph(modernbert_dirs[task], tmp_path / "out", task, tokenizer)


def test_int8_is_written_beside_and_its_agreement_reported(tmp_path, model_dirs):
    report = export_onnx(model_dirs["embed"], tmp_path / "out", int8=True)
    assert (tmp_path / "out" / "onnx" / "model_qint8.onnx").is_file()
    cosine = report["model_qint8.onnx"]["sentence_embedding"]["cosine"]
    assert 0.9 < cosine < report["model.onnx"]["sentence_embedding"]["cosine"]


def test_exporting_leaves_the_model_ready_for_inference(tmp_path, model_dirs):
    """torch's exporter puts back the module's mode: a module made in training mode (as every new module is) kept
    its dropout on after the export, and a benchmark timed that (it had called eval() on the model inside only)."""
    from unmask.models.onnx import GraphModule, write_graphs

    model = from_pretrained(model_dirs["embed"], "encoder").eval()
    module = GraphModule(model, "encoder")
    assert module.training
    write_graphs(module, tmp_path / "onnx")
    assert not model.training and not any(m.training for m in model.modules())
    ids = torch.randint(5, 100, (2, 12))
    with torch.no_grad():
        assert torch.equal(model(ids).last_hidden_state, model(ids).last_hidden_state)  # no dropout


def test_the_command_exports_in_place_and_refuses_a_folder_in_use(tmp_path, model_dirs):
    from shutil import copytree

    model = copytree(model_dirs["classify"], tmp_path / "model")
    done = subprocess.run([sys.executable, "-m", "unmask.cli", "export", "onnx", str(model)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (model / "onnx" / "model.onnx").is_file() and "logits cosine 1.0" in done.stdout
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("x")
    done = subprocess.run([sys.executable, "-m", "unmask.cli", "export", "onnx", str(model), str(tmp_path / "used")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "used is not empty" in done.stderr and "Traceback" not in done.stderr


def test_without_onnxruntime_the_error_names_the_install(tmp_path, model_dirs, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime now raises ImportError
    with pytest.raises(UsageError, match=r"pip install unmask\[onnx\]"):
        export_onnx(model_dirs["embed"], tmp_path / "out")


def loaders_python() -> str:
    """A Python with optimum-onnx and sentence-transformers: this one, or the environment `make loaders` builds
    (optimum-onnx requires transformers < 4.58, so it cannot live beside the test venv's transformers 5)."""
    try:
        import optimum.onnxruntime  # noqa: F401

        return sys.executable
    except ImportError:
        built = Path(__file__).parents[2] / ".venv-loaders" / "bin" / "python"
        if not built.is_file():
            pytest.skip("optimum-onnx is not installed here and .venv-loaders is missing: make loaders")
        return str(built)


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_optimum_and_sentence_transformers_load_every_exported_head(tmp_path, model_dirs, modernbert_dirs, arch):
    dirs = model_dirs if arch == "bert" else modernbert_dirs
    for task in HEADS:
        export_onnx(dirs[task], tmp_path / task, int8=task == "embed")
    pairs = [f"{HEADS[task]}={tmp_path / task}" for task in HEADS]
    done = subprocess.run([loaders_python(), str(Path(__file__).with_name("optimum_loads.py")),
                           str(tmp_path / "theirs.npz"), *pairs], input=json.dumps(TEXTS), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = np.load(tmp_path / "theirs.npz")
    for task, head in HEADS.items():
        ids, mask = (torch.from_numpy(theirs[f"{head}/{name}"]) for name in ("input_ids", "attention_mask"))
        assert ids.shape == (len(TEXTS), ids.shape[1]) and ids.shape[1] > 30  # their tokenizer read ours
        with torch.no_grad():
            ours = from_pretrained(dirs[task], head).eval()(ids, mask)
        expected = (ours.last_hidden_state if head == "encoder" else ours.logits).numpy()
        output = theirs[f"{head}/output"]
        real = mask.bool().numpy()
        if output.ndim == 3:  # per token: padding positions are no output
            output, expected = output[real], expected[real]
        assert np.abs(output - expected).max() <= 1e-5, task
    vectors = SentenceEncoder.from_pretrained(dirs["embed"]).encode(TEXTS)
    assert np.abs(theirs["encoder/sentence-transformers model.onnx"] - vectors).max() <= 1e-5
    int8 = theirs["encoder/sentence-transformers model_qint8.onnx"]
    cosine = (int8 * vectors).sum(1) / np.linalg.norm(int8, axis=1) / np.linalg.norm(vectors, axis=1)
    assert 0.8 < cosine.min() and cosine.max() < 0.99999  # the int8 graph, quantised


@pytest.mark.slow
def test_a_graph_over_2gb_lands_with_its_weights_in_one_file(tmp_path, tokenizer, model_dirs):
    """Protobuf caps a graph at 2 GB: torch's exporter then writes each weight to a file of its own; the export
    gathers them into model.onnx_data (optimum's name), and ORT runs the graph. A smaller graph exported over it
    later takes the stale data file away."""
    from unmask.config import BertConfig
    from unmask.models.bert import BertModel

    config = BertConfig(vocab_size=263_000, hidden_size=2048, num_hidden_layers=1, num_attention_heads=16,
                        intermediate_size=64, max_position_embeddings=64)  # 2.15 GB of word embeddings
    with torch.device("meta"):
        model = BertModel(config)
    model = model.to_empty(device="cpu")
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.02)
    model.save_pretrained(tmp_path / "big", tokenizer=tokenizer)
    del model
    report = export_onnx(tmp_path / "big", tmp_path / "out", int8=True)
    onnx_dir = tmp_path / "out" / "onnx"
    assert sorted(f.name for f in onnx_dir.iterdir()) == ["model.onnx", "model.onnx_data", "model_qint8.onnx",
                                                          "model_qint8.onnx.data", "unmask_export.json"]
    assert (onnx_dir / "model.onnx").stat().st_size < 2**20 and (onnx_dir / "model.onnx_data").stat().st_size > 2**31
    assert report["model.onnx"]["sentence_embedding"]["cosine"] >= 0.99999
    assert report["model_qint8.onnx"]["sentence_embedding"]["cosine"] > 0.9
    export_onnx(model_dirs["embed"], tmp_path / "out", int8=True)  # a small graph over the same folder
    assert sorted(f.name for f in onnx_dir.iterdir()) == ["model.onnx", "model_qint8.onnx", "unmask_export.json"]
