"""`unmask serve MODEL_DIR`: an HTTP server with text-embeddings-inference's routes and dynamic batching.

Routes (TEI's request and response shapes where TEI has the route, so its clients work unchanged):
    POST /embed      {"inputs": str | [str], "normalize": true, "truncate": bool}     -> [[float]]
    POST /rerank     {"query", "texts": [str], "raw_scores", "return_text", "truncate"} -> [{"index", "score"}]
    POST /predict    {"inputs": str | [str] | [[a, b]], "raw_scores", "truncate"}       -> [{"label", "score"}]
    POST /tokenize   {"inputs": str | [str], "add_special_tokens": true}
                     -> [[{"id", "text", "special", "start", "stop"}]]
    POST /fill-mask  {"inputs": str | [str], "top_k": 5}    -> the transformers fill-mask pipeline's shape
    POST /tag        {"inputs": str | [str], "truncate"}    -> [{"entity_group", "score", "word", "start", "end"}]
    GET  /health, /info, /metrics (Prometheus), /openapi.json, /docs

The model directory decides what is served: an encoder or sentence-transformers directory embeds, a
...ForSequenceClassification predicts and reranks, a ...ForMaskedLM fills masks, a ...ForTokenClassification tags;
other routes answer 400 saying what the model serves. Errors are JSON `{"error", "error_type"}` as in TEI: 400 for
a body that is not UTF-8 JSON or a route the model cannot serve, 413 for an oversized body, too many inputs or an
input over the length limit with truncation off, 422 for wrong types and empty inputs.
"""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from unmask import models
from unmask.errors import CheckpointError, UnmaskError, UsageError
from unmask.heads import SERVED_TASK, head_of
from unmask.hub import read_config
from unmask.pipelines.classify import label_scores, ranked, relevance, window_logits
from unmask.pipelines.embed import SentenceEncoder
from unmask.pipelines.fill_mask import fill_mask_tokens
from unmask.pipelines.tag import entities_of
from unmask.serve.batching import Batcher, BatchStats, Job
from unmask.tokenizer import load_tokenizer

# the routes that answer for each served task (unmask.heads.SERVED_TASK)
ROUTES = {"embed": ("embed",), "fill-mask": ("fill-mask",), "classify": ("predict", "rerank"), "tag": ("tag",)}


class ServeError(UnmaskError):
    """A request the server refuses: `status` and TEI's `error_type`."""

    def __init__(self, status: int, message: str, error_type: str = "Validation"):
        super().__init__(message)
        self.status, self.message, self.error_type = status, message, error_type


@dataclass
class ServeOptions:
    max_batch_tokens: int = 16384  # real tokens per forward pass
    max_client_batch_size: int = 32  # inputs per request
    forward_batch_size: int = 32  # sequences per forward pass: a batch of requests runs length-sorted in such passes
    max_input_length: int | None = None  # tokens per input; default and ceiling: the model's context
    truncation: str = "error"  # for requests that do not say: "error" (413) or "truncate" (TEI's --auto-truncate)
    payload_limit: int = 2_000_000  # bytes per request body
    int8: bool = False  # CPU: int8 dynamically quantised linear layers (models/quantize.py)
    bf16: bool = False  # bfloat16 weights and activations (GPUs; CPUs with AVX512-BF16 or AMX)

    def __post_init__(self):
        if self.truncation not in ("error", "truncate"):
            raise UsageError(f"--truncation must be error or truncate, got {self.truncation!r}")
        if self.int8 and self.bf16:
            raise UsageError("--int8 and --bf16 exclude each other: choose one")
        for name in ("max_batch_tokens", "max_client_batch_size", "forward_batch_size", "payload_limit"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name} must be at least 1, got {getattr(self, name)}")


class ServedModel:
    """A model directory and the one thing it answers; `run` is called on the batching thread with many inputs."""

    def __init__(self, path: str | Path, max_input_length: int | None = None, forward_batch_size: int = 32,
                 int8: bool = False, bf16: bool = False):
        self.path = Path(path)
        if not (self.path / "config.json").exists():
            raise CheckpointError(f"{self.path}: not a model directory (no config.json)")
        config = read_config(self.path)  # once: the head, the model and the tokenizer check all read it
        model_head = head_of(config.architectures)
        self.head = SERVED_TASK[model_head]
        self.encoder = None
        if self.head == "embed":
            self.encoder = SentenceEncoder.from_pretrained(self.path, int8=int8, bf16=bf16, config=config)
            self.model, self.tokenizer = self.encoder.model, self.encoder.tokenizer
            context = self.encoder.max_seq_length
        else:
            self.model = models.from_pretrained(self.path, model_head, int8=int8, bf16=bf16, config=config).eval()
            self.tokenizer = load_tokenizer(self.path, config)
            context = self.model.config.max_position_embeddings
        if max_input_length is not None and max_input_length < 3:
            raise UsageError(f"--max_input_length must leave room for [CLS] and [SEP], got {max_input_length}")
        self.max_input_length = min(max_input_length or context, context)
        if self.encoder is not None:
            self.encoder.max_seq_length = self.max_input_length
        self.routes = ROUTES[self.head]
        self.forward_batch_size = forward_batch_size

    def info(self) -> dict:
        config = self.model.config
        if self.head == "embed":
            kind = {"embedding": {"pooling": self.encoder.pooling, "dimension": self.encoder.dimension}}
        elif self.head == "classify":
            kind = {"classifier": {"id2label": {str(k): v for k, v in config.id2label.items()},
                                   "label2id": config.label2id}}
        else:
            kind = {self.head: {"id2label": {str(k): v for k, v in config.id2label.items()}}
                    if self.head == "tag" else {}}
        return {"model_id": str(self.path), "model_type": kind, "architecture": config.model_type,
                "model_dtype": "float32", "max_input_length": self.max_input_length, "routes": list(self.routes)}

    # -- validation (event loop side, in a thread pool) -------------------------------------------------------------

    def fit(self, items: list, truncate: bool) -> tuple[list, list[int], list]:
        """The inputs cut to max_input_length when `truncate` (else refused when longer), their token counts and
        encodings; all tokenized in one parallel call."""
        for index, item in enumerate(items):
            if any(not part.strip() for part in (item if isinstance(item, tuple) else (item,))):
                raise ServeError(422, f"input {index} is empty")
        encodings = self.tokenizer.encode_batch(items)
        limit = self.max_input_length
        for index, encoding in enumerate(encodings):
            n = len(encoding.ids)
            if n <= limit:
                continue
            if not truncate:
                raise ServeError(413, f"input {index} is {n} tokens, longer than the maximum of {limit}; send "
                                      "\"truncate\": true to cut it")
            # cut the last segment at the character where its allowed tokens end, then encode it again
            content = [p for p, t in enumerate(encoding.type_ids) if t == encoding.type_ids[-1]][:-1]
            if encoding.type_ids[-1] == 0:
                content = content[1:]  # after [CLS]
            keep = len(content) - (n - limit)
            if keep < 1:
                raise ServeError(413, f"input {index}: its query alone fills the maximum of {limit} tokens")
            item, end = items[index], encoding.offsets[content[keep - 1]][1]
            items[index] = (item[0], item[1][:end]) if isinstance(item, tuple) else item[:end]
            encodings[index] = self.tokenizer.encode_batch([items[index]])[0]
        return items, [len(e.ids) for e in encodings], encodings

    # -- the forward passes (batching thread) ------------------------------------------------------------------------

    def run(self, kind: str, inputs: list, options: tuple) -> list:
        """One result per input; `inputs` are (item, encoding) pairs, fitted to the limit already (nothing is cut
        here, so "truncate" only takes the first and only window)."""
        items, encodings = [item for item, _ in inputs], [encoding for _, encoding in inputs]
        n, pad = self.forward_batch_size, self.tokenizer.pad_token_id
        if kind == "embed":
            return list(self.encoder.encode_tokens(encodings, n, normalize=False, show_progress=False,
                                                   truncation="truncate"))
        if kind in ("predict", "rerank"):
            return list(window_logits(self.model, encodings, pad, "truncate", batch_size=n))
        if kind == "fill-mask":
            return fill_mask_tokens(self.model, self.tokenizer, encodings, top_k=options[0], batch_size=n)
        if kind == "tag":
            return entities_of(self.model, items, encodings, pad, truncation="truncate", batch_size=n)
        raise ValueError(f"unknown kind {kind!r}")


# -- the HTTP layer ---------------------------------------------------------------------------------------------------


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")  # TEI clients send fields we do not use (prompt_name, ...)


class EmbedRequest(_Request):
    inputs: str | list[str]
    normalize: bool = True
    truncate: bool | None = None


class RerankRequest(_Request):
    query: str
    texts: list[str]
    truncate: bool | None = None
    raw_scores: bool = False
    return_text: bool = False


class PredictRequest(_Request):
    inputs: str | list[str] | list[Annotated[list[str], Field(min_length=2, max_length=2)]]
    truncate: bool | None = None
    raw_scores: bool = False


class TokenizeRequest(_Request):
    inputs: str | list[str]
    add_special_tokens: bool = True


class FillMaskRequest(_Request):
    inputs: str | list[str]
    top_k: int = Field(5, ge=1, le=1000)


class TagRequest(_Request):
    inputs: str | list[str]
    truncate: bool | None = None


def create_app(model: ServedModel, options: ServeOptions):
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, PlainTextResponse
    from starlette.concurrency import run_in_threadpool

    metrics = Metrics()
    batcher_box: dict[str, Batcher] = {}

    @asynccontextmanager
    async def lifespan(app):
        batcher_box["batcher"] = Batcher(model.run, options.max_batch_tokens, metrics.observe_batch)
        yield
        # uvicorn has finished the in-flight requests when this runs (graceful shutdown on SIGTERM)
        batcher_box["batcher"].close()

    app = FastAPI(title="unmask serve", version=_version(), lifespan=lifespan,
                  description=f"Serving {model.path} ({model.head}).")
    app.add_middleware(BodyGuard, limit=options.payload_limit)

    @app.exception_handler(ServeError)
    async def serve_error(request: Request, error: ServeError):
        metrics.count(request.url.path, error.status)
        return JSONResponse({"error": error.message, "error_type": error.error_type}, status_code=error.status)

    @app.exception_handler(Exception)
    async def failed(request: Request, error: Exception):  # a bug, not the client's fault: JSON all the same
        metrics.count(request.url.path, 500)
        return JSONResponse({"error": f"{type(error).__name__}: {error}", "error_type": "Backend"}, status_code=500)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError):
        first = error.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())[1:]) or "body"
        metrics.count(request.url.path, 422)
        return JSONResponse({"error": f"{where}: {first.get('msg')}", "error_type": "Validation"}, status_code=422)

    def serves(route: str) -> None:
        if route not in model.routes:
            raise ServeError(400, f"{model.path.name} is a {model.head} model: it serves "
                                  f"{', '.join('/' + r for r in model.routes)}, not /{route}", "Unsupported")

    def as_list(inputs) -> tuple[list, bool]:
        single = isinstance(inputs, str)
        items = [inputs] if single else list(inputs)
        if not items:
            raise ServeError(422, "inputs is empty")
        if len(items) > options.max_client_batch_size:
            raise ServeError(413, f"batch size {len(items)} > maximum allowed batch size "
                                  f"{options.max_client_batch_size}")
        return items, single

    async def schedule(kind: str, items: list, truncate: bool | None, job_options: tuple = (),
                       check=lambda encodings: None) -> list:
        """Validate and count the inputs (in a worker thread: tokenizing is not the event loop's job), queue them."""
        cut = options.truncation == "truncate" if truncate is None else truncate
        fitted, counts, encodings = await run_in_threadpool(model.fit, items, cut)
        check(encodings)
        job = Job(kind, list(zip(fitted, encodings)), sum(counts), job_options)
        results = await batcher_box["batcher"].submit(job)
        metrics.count("/" + kind, 200)
        return results

    @app.post("/embed", summary="Sentence embeddings (TEI's /embed)")
    async def embed(body: EmbedRequest) -> list[list[float]]:
        serves("embed")
        items, _ = as_list(body.inputs)
        vectors = np.stack(await schedule("embed", items, body.truncate))
        if body.normalize:
            vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        return vectors.tolist()

    @app.post("/rerank", summary="Score texts against a query with a cross-encoder (TEI's /rerank)")
    async def rerank(body: RerankRequest) -> list[dict]:
        serves("rerank")
        texts, _ = as_list(body.texts)
        if not body.query.strip():
            raise ServeError(422, "query is empty")
        logits = np.stack(await schedule("rerank", [(body.query, t) for t in texts], body.truncate))
        answers = ranked(relevance(logits, body.raw_scores))
        if body.return_text:
            answers = [{**answer, "text": texts[answer["index"]]} for answer in answers]
        return answers

    @app.post("/predict", summary="Sequence classification (TEI's /predict): every label, best first")
    async def predict(body: PredictRequest) -> list:
        serves("predict")
        items, single = as_list(body.inputs)
        items = [tuple(x) if isinstance(x, list) else x for x in items]
        logits = np.stack(await schedule("predict", items, body.truncate))
        answers = label_scores(logits, model.model.config.id2label or {}, body.raw_scores)
        return answers[0] if single else answers

    @app.post("/tokenize", summary="Tokens with their character offsets (TEI's /tokenize)")
    async def tokenize(body: TokenizeRequest) -> list[list[dict]]:
        items, _ = as_list(body.inputs)
        encodings = await run_in_threadpool(model.tokenizer.encode_batch, items, body.add_special_tokens)
        metrics.count("/tokenize", 200)
        out = []
        for text, enc in zip(items, encodings):
            out.append([{"id": i, "text": text[a:b] if not special else model.tokenizer.convert_ids_to_tokens([i])[0],
                         "special": bool(special), "start": None if special else a, "stop": None if special else b}
                        for i, (a, b), special in zip(enc.ids, enc.offsets, enc.special_tokens_mask)])
        return out

    @app.post("/fill-mask", summary="Fill [MASK] (the transformers fill-mask pipeline's shape)")
    async def fill(body: FillMaskRequest) -> list:
        serves("fill-mask")
        items, single = as_list(body.inputs)
        mask = model.tokenizer.mask_token_id

        def has_masks(encodings) -> None:
            for i, encoding in enumerate(encodings):
                if mask not in encoding.ids:
                    raise ServeError(422, f"input {i} has no {model.tokenizer.convert_ids_to_tokens([mask])[0]}")

        results = await schedule("fill-mask", items, False, (body.top_k,), has_masks)
        return results[0] if single else results

    @app.post("/tag", summary="Named entities with character offsets")
    async def tag(body: TagRequest) -> list:
        serves("tag")
        items, single = as_list(body.inputs)
        results = await schedule("tag", items, body.truncate)
        return results[0] if single else results

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/info")
    async def info() -> dict:
        return {**model.info(), "max_batch_tokens": options.max_batch_tokens,
                "max_client_batch_size": options.max_client_batch_size,
                "auto_truncate": options.truncation == "truncate", "payload_limit": options.payload_limit,
                "version": _version()}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus() -> str:
        queue = batcher_box["batcher"].queue_size() if "batcher" in batcher_box else 0
        return metrics.render(queue)

    return app


class BodyGuard:
    """ASGI middleware: a request body over `limit` bytes answers 413 before it is read whole; a body that is not
    UTF-8 JSON answers 400 (not a traceback, not FastAPI's guess at another encoding)."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await _reply(send, 413, f"body of {int(declared)} bytes exceeds the limit of {self.limit}",
                                "Validation")
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                return await _reply(send, 413, f"body exceeds the limit of {self.limit} bytes", "Validation")
            chunks.append(chunk)
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        try:
            json.loads(body.decode("utf-8"))
        except UnicodeDecodeError as e:
            return await _reply(send, 400, f"the body is not valid UTF-8 (byte {e.start})", "Validation")
        except json.JSONDecodeError as e:
            return await _reply(send, 400, f"malformed JSON: {e}", "Validation")
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


async def _reply(send, status: int, message: str, error_type: str) -> None:
    payload = json.dumps({"error": message, "error_type": error_type}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


class Metrics:
    """Prometheus counters and histograms of one server (its own registry: several apps can live in one process)."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry()
        self.requests = Counter("unmask_requests", "Requests answered, by route and status", ["route", "status"],
                                registry=self.registry)
        self.batch_inputs = Histogram("unmask_batch_inputs", "Inputs per forward pass", registry=self.registry,
                                      buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512))
        self.batch_tokens = Histogram("unmask_batch_tokens", "Real tokens per forward pass", registry=self.registry,
                                      buckets=(64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536))
        self.queue_seconds = Histogram("unmask_queue_seconds", "Time a request waited for its forward pass",
                                       registry=self.registry)
        self.forward_seconds = Histogram("unmask_forward_seconds", "Time of a batched forward pass",
                                         registry=self.registry)
        self.tokens = Counter("unmask_tokens", "Real tokens processed", registry=self.registry)
        self.last_rate = 0.0

    def count(self, route: str, status: int) -> None:
        self.requests.labels(route=route, status=str(status)).inc()

    def observe_batch(self, stats: BatchStats) -> None:
        self.batch_inputs.observe(stats.inputs)
        self.batch_tokens.observe(stats.tokens)
        self.forward_seconds.observe(stats.forward_seconds)
        self.tokens.inc(stats.tokens)
        for waited in stats.queue_seconds:
            self.queue_seconds.observe(waited)
        self.last_rate = stats.tokens / max(stats.forward_seconds, 1e-9)

    def render(self, queue_size: int) -> str:
        from prometheus_client import generate_latest

        extra = (f"# HELP unmask_queue_size Requests waiting for a forward pass\n# TYPE unmask_queue_size gauge\n"
                 f"unmask_queue_size {queue_size}\n"
                 f"# HELP unmask_tokens_per_second Tokens per second of the last forward pass\n"
                 f"# TYPE unmask_tokens_per_second gauge\nunmask_tokens_per_second {self.last_rate}\n")
        return generate_latest(self.registry).decode() + extra


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("unmask")
    except PackageNotFoundError:
        return "0+unknown"


def serve(model_dir: str, host: str = "127.0.0.1", port: int = 8080, options: ServeOptions | None = None,
          log_level: str = "info") -> None:
    import uvicorn

    options = options or ServeOptions()
    model = ServedModel(model_dir, options.max_input_length, options.forward_batch_size, options.int8,
                        options.bf16)
    print(f"unmask serve: {model.path} ({model.head}; routes {', '.join('/' + r for r in model.routes)}) "
          f"on http://{host}:{port}", flush=True)
    uvicorn.run(create_app(model, options), host=host, port=port, log_level=log_level,
                timeout_graceful_shutdown=60)
