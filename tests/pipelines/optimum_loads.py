"""Load exported directories the way sentence-transformers' and optimum's users do; run in an environment where they
are installed (optimum-onnx needs transformers < 4.58: `make loaders` builds one beside the test venv).

    python optimum_loads.py OUT.npz HEAD=DIR [HEAD=DIR ...] < texts.json

For each head: the token ids and mask that transformers' AutoTokenizer made of the texts, and the outputs of
optimum's `ORTModelFor...` on them; for an encoder also sentence-transformers' `backend="onnx"` vectors (fp32 and
int8 graphs).
"""

import json
import sys

import numpy as np
from optimum import onnxruntime as ort_models
from sentence_transformers import SentenceTransformer
from transformers import AutoTokenizer

LOADERS = {"encoder": ort_models.ORTModelForFeatureExtraction,
           "sequence-classification": ort_models.ORTModelForSequenceClassification,
           "token-classification": ort_models.ORTModelForTokenClassification,
           "masked-lm": ort_models.ORTModelForMaskedLM}


def main(out: str, pairs: list[str]) -> None:
    texts = json.load(sys.stdin)
    found = {}
    for pair in pairs:
        head, path = pair.split("=", 1)
        batch = AutoTokenizer.from_pretrained(path)(texts, padding=True, return_tensors="np")
        model = LOADERS[head].from_pretrained(path, subfolder="onnx", file_name="model.onnx")
        outputs = model(**batch)
        found[f"{head}/input_ids"], found[f"{head}/attention_mask"] = batch["input_ids"], batch["attention_mask"]
        found[f"{head}/output"] = np.asarray(outputs.last_hidden_state if head == "encoder" else outputs.logits)
        if head == "encoder":
            for name in ("model.onnx", "model_qint8.onnx"):
                encoder = SentenceTransformer(path, backend="onnx", device="cpu", model_kwargs={"file_name": name})
                found[f"{head}/sentence-transformers {name}"] = encoder.encode(texts)
    np.savez(out, **found)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
