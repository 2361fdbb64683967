"""The request bodies `unmask serve` reads: text-embeddings-inference's (TEI 1.9), OpenAI's embeddings request, and
the Hugging Face inference shape `{"inputs": ..., "parameters": {...}}` (its parameters read as fields).

Unknown fields are ignored, as TEI ignores them; a field we read is honoured or refused, never dropped.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Item = str | list[int]  # a text, or a text's token ids
Inputs = Item | list[Item]


class Request(BaseModel):
    """Fields may also come in `parameters` (what `huggingface_hub.InferenceClient` sends); `hf_shape` is then set,
    and the answer takes the Hugging Face pipeline's shape where it differs from TEI's."""

    model_config = ConfigDict(extra="ignore")
    hf_shape: bool = False

    @model_validator(mode="before")
    @classmethod
    def _read_parameters(cls, data):
        if isinstance(data, dict) and isinstance(data.get("parameters"), dict):
            return {**{k: v for k, v in data.items() if k != "parameters"}, **data["parameters"], "hf_shape": True}
        return data


class Fitting(Request):
    """How inputs are fitted to the context: TEI's `truncate`, `truncation_direction` and `prompt_name`."""

    truncate: bool | None = None
    truncation_direction: Literal["right", "left", "Right", "Left"] = "right"
    prompt_name: str | None = None


class EmbedRequest(Fitting):
    inputs: Inputs
    normalize: bool = True
    dimensions: int | None = None


class EmbedAllRequest(Fitting):
    inputs: Inputs


class EmbedSparseRequest(Fitting):
    inputs: Inputs


class SimilarityInputs(BaseModel):
    source_sentence: str
    sentences: list[str]


class SimilarityRequest(Fitting):
    inputs: SimilarityInputs


class OpenAIEmbeddingsRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    input: Inputs
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None


class RerankRequest(Fitting):
    query: str
    texts: list[str]
    raw_scores: bool = False
    return_text: bool = False


class PredictRequest(Fitting):
    """TEI's inputs: a text, a pair `[a, b]`, or a batch of singles and pairs `[[a], [b, c]]`."""

    inputs: str | list[str] | list[list[str]]
    raw_scores: bool = False
    top_k: int | None = Field(None, ge=1)  # the Hugging Face shape's text-classification parameter
    function_to_apply: Literal["sigmoid", "softmax", "none"] | None = None


class TokenizeRequest(Request):
    inputs: str | list[str]
    add_special_tokens: bool = True
    prompt_name: str | None = None


class DecodeRequest(Request):
    ids: list[int] | list[list[int]]
    skip_special_tokens: bool = True


class FillMaskRequest(Request):
    inputs: str | list[str]
    top_k: int = Field(5, ge=1)
    truncate: bool | None = None
    targets: None = Field(None, description="not supported: refused when given")


class TagRequest(Request):
    inputs: str | list[str]
    truncate: bool | None = None
    aggregation_strategy: Literal["first"] | None = None  # the one unmask computes (the pipeline's "first")
