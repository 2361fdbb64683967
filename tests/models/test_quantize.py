"""The opt-in inference modes: int8 (every linear layer quantised, outputs close to fp32, accuracy cost bounded)
and bf16 (weights and activations in bfloat16, outputs within its rounding of fp32)."""

import numpy as np
import pytest
import torch
import torch.nn as nn

from conftest import shared_data
from unmask import models
from unmask.config import load_config
from unmask.models import for_inference, quantize
from unmask.models.quantize import quantize_int8
from unmask.pipelines.embed import SentenceEncoder

SENTENCES = ["A man is playing a guitar on the street.", "The cat sleeps in the warm sun all afternoon.",
             "Stock markets fell sharply after the announcement.", "She reads a book about ancient Rome."]


ENGINES = [e for e in ("x86", "onednn") if e in torch.backends.quantized.supported_engines]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("preset", ["bert-tiny", "modernbert-tiny"])
def test_every_linear_layer_is_quantised_and_outputs_stay_close(preset, engine, monkeypatch):
    monkeypatch.setattr(quantize, "packing_engine", lambda: engine)  # each engine's kernels, whatever this CPU has
    torch.manual_seed(0)
    config = load_config(preset, vocab_size=500, pad_token_id=0)
    model = models.from_config(config, "masked-lm").eval()
    ids = torch.randint(5, 500, (3, 24))
    mask = torch.ones_like(ids)
    mask[1, 15:] = 0
    with torch.inference_mode():
        reference = model(ids, mask).logits
        quantize_int8(model)
        logits = model(ids, mask).logits
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    assert logits.shape == reference.shape
    real = mask.bool()
    cosine = torch.nn.functional.cosine_similarity(logits[real], reference[real], dim=-1)
    assert cosine.min() > 0.99, cosine.min()


def test_packs_for_onednn_where_the_cpu_has_amx_and_leaves_the_engine_setting_alone(monkeypatch):
    from torch.ao.nn.quantized.modules.linear import LinearPackedParams

    engines, pack = [], LinearPackedParams.set_weight_bias

    def recording_pack(self, *args):  # the engine in force when each weight is packed decides its kernels
        engines.append(torch.backends.quantized.engine)
        return pack(self, *args)

    monkeypatch.setattr(LinearPackedParams, "set_weight_bias", recording_pack)
    amx = torch.cpu._is_amx_tile_supported()
    before = torch.backends.quantized.engine
    assert quantize.packing_engine() == ("onednn" if amx else before)
    model = quantize_int8(models.from_config(load_config("bert-tiny", vocab_size=500), "encoder"))
    assert torch.backends.quantized.engine == before
    assert len(engines) >= 12 and set(engines) == {quantize.packing_engine()}, engines  # 2 layers x 6 linears
    ids = torch.randint(5, 500, (2, 9))
    with torch.inference_mode():  # weights packed for one engine run under the other's setting
        assert torch.isfinite(model(ids, torch.ones_like(ids)).last_hidden_state).all()


def test_minilm_embeddings_in_int8_stay_close_to_fp32(minilm_dir):
    fp32 = SentenceEncoder.from_pretrained(minilm_dir).encode(SENTENCES)
    int8 = SentenceEncoder.from_pretrained(minilm_dir, int8=True).encode(SENTENCES)
    cosine = (fp32 * int8).sum(1) / (np.linalg.norm(fp32, axis=1) * np.linalg.norm(int8, axis=1))
    # per-tensor int8 activations cost ~2.5% of cosine on MiniLM (measured 0.973-0.982 here; mean 0.973 on 200
    # book sentences); what matters to users is ranking, checked on STS-B below
    assert cosine.min() > 0.95, cosine
    assert cosine.max() < 0.9999  # it did quantise


def test_minilm_stsb_spearman_drop_is_small(minilm_dir):
    from unmask.data.readers import read_sts
    from unmask.train.evaluate import evaluate_sts

    pairs = read_sts(shared_data("stsb", "sts-dev.csv"))
    fp32 = evaluate_sts(SentenceEncoder.from_pretrained(minilm_dir), *pairs)["spearman"]
    int8 = evaluate_sts(SentenceEncoder.from_pretrained(minilm_dir, int8=True), *pairs)["spearman"]
    assert fp32 == pytest.approx(0.8672, abs=5e-4)
    assert fp32 - int8 <= 0.005, (fp32, int8)  # measured 0.0032


def test_a_quantised_model_is_not_saved(tmp_path):
    model = quantize_int8(models.from_config(load_config("bert-tiny", vocab_size=500), "masked-lm"))
    with pytest.raises(ValueError, match="int8-quantised"):
        model.save_pretrained(tmp_path / "q")
    assert not (tmp_path / "q").exists()


def test_refuses_bf16_weights():
    model = models.from_config(load_config("bert-tiny", vocab_size=500), "encoder").to(torch.bfloat16)
    with pytest.raises(ValueError, match="float32"):
        quantize_int8(model)


@pytest.mark.parametrize("preset", ["bert-tiny", "modernbert-tiny"])
def test_bf16_inference_stays_close_to_fp32(preset):
    torch.manual_seed(0)
    model = models.from_config(load_config(preset, vocab_size=500, pad_token_id=0), "masked-lm").eval()
    ids = torch.randint(5, 500, (3, 24))
    mask = torch.ones_like(ids)
    mask[1, 15:] = 0
    with torch.inference_mode():
        reference = model(ids, mask).logits
        logits = for_inference(model, bf16=True)(ids, mask).logits
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    real = mask.bool()
    cosine = torch.nn.functional.cosine_similarity(logits[real].float(), reference[real], dim=-1)
    assert cosine.min() > 0.99, cosine.min()


def test_minilm_embeddings_in_bf16_stay_close_to_fp32(minilm_dir):
    fp32 = SentenceEncoder.from_pretrained(minilm_dir).encode(SENTENCES)
    encoder = SentenceEncoder.from_pretrained(minilm_dir, bf16=True)
    bf16 = encoder.encode(SENTENCES)
    assert bf16.dtype == np.float32 and encoder.model.embeddings.word_embeddings.weight.dtype == torch.bfloat16
    cosine = (fp32 * bf16).sum(1) / (np.linalg.norm(fp32, axis=1) * np.linalg.norm(bf16, axis=1))
    assert cosine.min() > 0.998, cosine  # 8 mantissa bits through 6 layers
    assert cosine.max() < 0.999999  # it did run in bf16


def test_int8_and_bf16_exclude_each_other():
    model = models.from_config(load_config("bert-tiny", vocab_size=500), "encoder")
    with pytest.raises(ValueError, match="choose one"):
        for_inference(model, int8=True, bf16=True)
