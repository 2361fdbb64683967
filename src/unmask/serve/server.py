"""`unmask serve MODEL_DIR`: text-embeddings-inference's HTTP API (TEI 1.9), OpenAI's embeddings API and the
Hugging Face inference shape, over one model with dynamic batching.

    POST /embed         {"inputs", "normalize", "truncate", "truncation_direction", "prompt_name", "dimensions"}
    POST /embed_all     the vectors of every token
    POST /similarity    {"inputs": {"source_sentence", "sentences"}}  -> cosine similarities
    POST /v1/embeddings, /embeddings   OpenAI: {"input", "model", "encoding_format", "dimensions", "user"}
    POST /predict       {"inputs": text | [a, b] | [[a], [b, c]], "raw_scores", "truncate"}
    POST /rerank        {"query", "texts", "raw_scores", "return_text", "truncate"}
    POST /tokenize, /decode, /fill-mask, /tag (the last two are ours; TEI has no such routes)
    POST /, /invocations   the model's main route (InferenceClient, SageMaker); `parameters` are read as fields
    GET  /, /health, /ping, /info, /metrics (Prometheus), /openapi.json

Inputs are texts or token ids. The model directory decides what is served (an encoder embeds, a classifier
predicts and reranks, a masked LM fills masks, a token classifier tags); another route answers 400 saying what the
model serves. Errors are `{"error", "error_type"}` (OpenAI's `{"error": {"message", "type", "code"}}` on its routes)
with TEI's codes: 413 for too many or too long inputs, 400 for empty ones and bodies that are not JSON, 422 for
wrong fields.
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import json
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import ValidationError

from unmask.pipelines.classify import label_scores, ranked, relevance
from unmask.serve.batching import Batcher, BatchStats, Job
from unmask.serve.model import ServedModel, ServeError, TokenIds, matryoshka
from unmask.serve.options import ServeOptions
from unmask.serve.schemas import (
    DecodeRequest,
    EmbedAllRequest,
    EmbedRequest,
    EmbedSparseRequest,
    FillMaskRequest,
    Fitting,
    OpenAIEmbeddingsRequest,
    PredictRequest,
    RerankRequest,
    SimilarityRequest,
    TagRequest,
    TokenizeRequest,
)

OPENAI_ROUTES = ("/v1/embeddings", "/embeddings")
OPEN_ROUTES = ("/", "/health", "/ping", "/metrics")  # GET routes anyone may call, with --api_key too
CHUNKED = ("embed", "predict", "rerank", "tag")  # what --truncation chunk reads in windows (others refuse)
_timings: contextvars.ContextVar[dict] = contextvars.ContextVar("timings")  # this request's, for its headers


@dataclass
class Service:
    """What every route needs: the model, the options, the metrics and the batcher that runs the model."""

    model: ServedModel
    options: ServeOptions
    batcher: Batcher
    metrics: "Metrics" = field(default_factory=lambda: Metrics())
    tokenizers: ThreadPoolExecutor | None = None

    def __post_init__(self):
        self.tokenizers = ThreadPoolExecutor(self.options.tokenization_workers, thread_name_prefix="unmask-tokenize")

    async def in_tokenizer_thread(self, fn, *args):
        """`fn(*args)` on a tokenization worker (never on the event loop, never on the model's thread)."""
        started = time.perf_counter()
        result = await asyncio.get_running_loop().run_in_executor(self.tokenizers, fn, *args)
        _record(tokenization=time.perf_counter() - started)
        return result

    def serves(self, route: str) -> None:
        if route not in self.model.routes:
            raise ServeError(400, f"{self.model.name} is a {self.model.head} model: it serves "
                                  f"{', '.join('/' + r for r in self.model.routes)}, not /{route}", "Unsupported")

    def batch(self, inputs) -> tuple[list, bool]:
        """(items, single): a text or a token-id list is one input; a list of them is a batch."""
        single = isinstance(inputs, str) or (isinstance(inputs, list) and bool(inputs) and
                                             all(isinstance(x, int) for x in inputs))
        items = [inputs] if single else list(inputs)
        if not items:
            raise ServeError(400, "inputs is empty", "Empty")
        if len(items) > self.options.max_client_batch_size:
            raise ServeError(413, f"batch size {len(items)} > maximum allowed batch size "
                                  f"{self.options.max_client_batch_size}")
        return [TokenIds(x) if isinstance(x, list) else x for x in items], single

    async def answer(self, route: str, kind: str, inputs, fitting: Fitting | None = None) -> tuple[list, int]:
        """A route's batch of inputs through the model: checked to be this model's route and size, then run."""
        self.serves(route)
        items, _ = self.batch(inputs)
        return await self.run(kind, items, fitting)

    async def run(self, kind: str, items: list, fitting: Fitting | None = None, job_options: tuple = (),
                  check=lambda encodings: None) -> tuple[list, int]:
        """Fit the inputs (in a worker thread), queue them for a batched forward pass; (results, tokens)."""
        mode = "truncate" if fitting is not None and fitting.truncate else self.options.truncation
        if mode == "chunk" and kind not in CHUNKED:
            mode = "error"
        direction = fitting.truncation_direction.lower() if fitting is not None else "right"
        embedding = kind in ("embed", "embed_all", "embed_sparse")
        prompt = self.model.prompt(getattr(fitting, "prompt_name", None)) if embedding else ""
        encodings = await self.in_tokenizer_thread(self.model.fit, items, mode, direction, prompt)
        check(encodings)
        tokens = sum(len(e.ids) for e in encodings)
        job = Job(kind, list(zip(items, encodings)), tokens, job_options)
        results = await self.batcher.submit(job)
        _record(queue=job.started - job.enqueued, inference=job.finished - job.started, tokens=tokens)
        return results, tokens


def _record(**values) -> None:
    timings = _timings.get(None)
    if timings is not None:
        timings.update(values)


def create_app(batcher: Batcher, options: ServeOptions):
    """The app over a model that `batcher` built and runs (`Batcher(lambda: ServedModel(path, options), ...)`)."""
    model = batcher.model
    service = Service(model, options, batcher=batcher)
    batcher.on_batch = service.metrics.observe_batch

    @asynccontextmanager
    async def lifespan(app):
        yield
        # uvicorn has finished the requests in flight (or --graceful_timeout has passed) when this runs
        service.batcher.close(timeout=options.graceful_timeout)
        service.tokenizers.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="unmask serve", version=_version(), lifespan=lifespan, docs_url=None, redoc_url=None,
                  description=f"Serving {model.name} ({model.head}).")
    app.add_middleware(BodyGuard, limit=options.payload_limit)
    app.add_middleware(Gate, service=service)  # outermost: refused requests cost nothing more
    _add_error_handlers(app, service)
    handlers = {**_add_embedding_routes(app, service), **_add_classification_routes(app, service),
                **_add_token_routes(app, service)}
    _add_service_routes(app, service, handlers)
    return app


def _add_error_handlers(app, service: Service) -> None:

    @app.exception_handler(ServeError)
    async def refused(request: Request, error: ServeError):
        return _error(request, error.status, error.message, error.error_type)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError):
        first = error.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())[1:]) or "body"
        return _error(request, 422, f"{where}: {first.get('msg')}", "Validation")

    @app.exception_handler(Exception)
    async def failed(request: Request, error: Exception):  # a bug, not the client's fault: JSON all the same
        return _error(request, 500, f"{type(error).__name__}: {error}", "Backend")


def _error(request, status: int, message: str, error_type: str):
    if request.url.path in OPENAI_ROUTES:  # OpenAI's error shape, so its client raises the right exception
        return JSONResponse({"error": {"message": message, "type": error_type, "code": status}}, status_code=status)
    return JSONResponse({"error": message, "error_type": error_type}, status_code=status)


def _add_embedding_routes(app, service: Service) -> dict:
    model = service.model

    @app.post("/embed", summary="Sentence embeddings (TEI's /embed)")
    async def embed(body: EmbedRequest) -> list[list[float]]:
        vectors, _ = await service.answer("embed", "embed", body.inputs, body)
        return matryoshka(np.stack(vectors), body.dimensions, body.normalize).tolist()

    @app.post("/embed_all", summary="The vector of every token (TEI's /embed_all)")
    async def embed_all(body: EmbedAllRequest) -> list[list[list[float]]]:
        vectors, _ = await service.answer("embed_all", "embed_all", body.inputs, body)
        return [v.tolist() for v in vectors]

    @app.post("/embed_sparse", summary="SPLADE vectors from a masked LM served with --pooling splade (TEI's)")
    async def embed_sparse(body: EmbedSparseRequest) -> list[list[dict]]:
        vectors, _ = await service.answer("embed_sparse", "embed_sparse", body.inputs, body)
        return [[{"index": i, "value": v} for i, v in vector.items()] for vector in vectors]

    @app.post("/similarity", summary="Cosine similarity of sentences to a source sentence (TEI's /similarity)")
    async def similarity(body: SimilarityRequest) -> list[float]:
        sentences = [body.inputs.source_sentence, *body.inputs.sentences]
        vectors, _ = await service.answer("similarity", "embed", sentences, body)
        unit = matryoshka(np.stack(vectors), None, normalize=True)
        return (unit[1:] @ unit[0]).tolist()

    async def openai_embeddings(body: OpenAIEmbeddingsRequest) -> dict:
        vectors, tokens = await service.answer("embeddings", "embed", body.input)
        unit = matryoshka(np.stack(vectors), body.dimensions, normalize=True).astype(np.float32)
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode() if body.encoding_format == "base64"
                 else v.tolist()} for i, v in enumerate(unit)]
        service.metrics.count("/v1/embeddings", 200)
        return {"object": "list", "data": data, "model": model.name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    for path in OPENAI_ROUTES:
        app.post(path, summary="OpenAI's embeddings API")(openai_embeddings)
    return {"embed": embed, "similarity": similarity, "embed_sparse": embed_sparse}  # what POST / dispatches to


def _add_classification_routes(app, service: Service) -> dict:
    model = service.model

    @app.post("/predict", summary="Sequence classification (TEI's /predict): every label, best first")
    async def predict(body: PredictRequest) -> list:
        service.serves("predict")
        items, single = _predict_items(body.inputs, service)
        logits, _ = await service.run("predict", items, body)
        answers = label_scores(np.stack(logits), model.model.config.id2label or {}, body.raw_scores, body.top_k,
                               body.function_to_apply)
        if body.hf_shape:  # the Hugging Face text-classification shape: a list per input
            return answers
        return answers[0] if single else answers

    @app.post("/rerank", summary="Score texts against a query with a cross-encoder (TEI's /rerank)")
    async def rerank(body: RerankRequest) -> list[dict]:
        service.serves("rerank")
        texts, _ = service.batch(body.texts)
        logits, _ = await service.run("rerank", [(body.query, t) for t in texts], body)
        answers = ranked(relevance(np.stack(logits), body.raw_scores))
        if body.return_text:
            answers = [{**answer, "text": texts[answer["index"]]} for answer in answers]
        return answers

    return {"predict": predict, "rerank": rerank}


def _predict_items(inputs, service: Service) -> tuple[list, bool]:
    """TEI's reading: a text, `[a, b]` one pair, `[[a], [b, c]]` a batch of singles and pairs."""
    if isinstance(inputs, str):
        return [inputs], True
    if inputs and all(isinstance(x, str) for x in inputs):
        if len(inputs) != 2:
            raise ServeError(422, f"inputs: a list of strings is one pair [a, b], got {len(inputs)} strings (a batch "
                                  "is [[a], [b, c], ...])")
        return [tuple(inputs)], True
    for i, x in enumerate(inputs):
        if len(x) not in (1, 2):
            raise ServeError(422, f"inputs.{i}: a batch holds [text] or [text, text], got {len(x)} texts")
    items, _ = service.batch([x[0] if len(x) == 1 else tuple(x) for x in inputs])
    return items, False


def _add_token_routes(app, service: Service) -> dict:
    model = service.model

    @app.post("/tokenize", summary="Tokens with their offsets in UTF-8 bytes (TEI's /tokenize)")
    async def tokenize(body: TokenizeRequest) -> list[list[dict]]:

        items, _ = service.batch(body.inputs)
        prompt = model.prompt(body.prompt_name)
        encodings = await service.in_tokenizer_thread(model.fit, items, "error", "right", prompt)  # bounded
        return [_tokens(prompt + text, enc, model, body.add_special_tokens) for text, enc in zip(items, encodings)]

    @app.post("/decode", summary="Token ids back to text (TEI's /decode)")
    async def decode(body: DecodeRequest) -> list[str]:
        batch = body.ids if body.ids and isinstance(body.ids[0], list) else [body.ids]
        items, _ = service.batch([list(ids) for ids in batch])
        vocabulary = model.model.config.vocab_size
        if any(not 0 <= i < vocabulary for ids in batch for i in ids):
            raise ServeError(422, f"ids must lie in [0, {vocabulary})")
        return model.tokenizer.backend.decode_batch(batch, skip_special_tokens=body.skip_special_tokens)

    @app.post("/fill-mask", summary="Fill [MASK] (the transformers fill-mask pipeline's shape)")
    async def fill(body: FillMaskRequest) -> list:
        service.serves("fill-mask")
        items, single = service.batch(body.inputs)
        mask = model.tokenizer.mask_token_id

        top_k = min(body.top_k, model.model.config.vocab_size)

        def bounded(encodings) -> None:  # the answer's size is known before any work is queued
            masks = [encoding.ids.count(mask) for encoding in encodings]
            for i, count in enumerate(masks):
                if not count:
                    raise ServeError(422, f"input {i} has no {model.tokenizer.convert_ids_to_tokens([mask])[0]}")
            if sum(masks) * top_k > service.options.max_fill_mask_answers:
                raise ServeError(413, f"{sum(masks)} masks x top_k {top_k} = {sum(masks) * top_k} answers, more than "
                                      f"the server's maximum of {service.options.max_fill_mask_answers}")

        results, _ = await service.run("fill-mask", items, Fitting(truncate=body.truncate), (top_k,), bounded)
        return results[0] if single else results

    @app.post("/tag", summary="Named entities with character offsets")
    async def tag(body: TagRequest) -> list:
        service.serves("tag")
        items, single = service.batch(body.inputs)
        results, _ = await service.run("tag", items, Fitting(truncate=body.truncate))
        return results[0] if single else results

    return {"fill-mask": fill, "tag": tag}


def _tokens(text: str, encoding, model: ServedModel, add_special_tokens: bool) -> list[dict]:
    """TEI's token records: offsets in UTF-8 bytes of the text."""
    byte_at = np.concatenate([[0], np.cumsum([len(c.encode("utf-8", "surrogatepass")) for c in text])])
    out = []
    for i, (a, b), special in zip(encoding.ids, encoding.offsets, encoding.special_tokens_mask):
        if special and not add_special_tokens:
            continue
        out.append({"id": i, "text": model.tokenizer.convert_ids_to_tokens([i])[0] if special else text[a:b],
                    "special": bool(special), "start": None if special else int(byte_at[a]),
                    "stop": None if special else int(byte_at[b])})
    return out


def _add_service_routes(app, service: Service, handlers: dict) -> None:
    model, options = service.model, service.options

    async def main_route(request: Request):
        """The model's main route, as TEI answers POST / (and SageMaker's /invocations); the body's shape picks
        between /embed and /similarity for an embedding model."""
        body = await request.json()
        if not isinstance(body, dict):
            raise ServeError(422, "body: a JSON object is expected")
        if model.routes[0] == "embed_sparse":
            route = "embed_sparse"
        elif model.head == "embed":
            route = "similarity" if isinstance(body.get("inputs"), dict) else "embed"
        elif model.head == "classify":
            route = "rerank" if "query" in body and "texts" in body else "predict"
        else:
            route = model.head
        return await handlers[route](_validated(_SCHEMAS[route], body))

    for path in ("/", "/invocations"):
        app.post(path, summary="The model's main route (TEI's POST /)")(main_route)

    @app.get("/health")
    @app.get("/ping")
    @app.get("/")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/info")
    async def info() -> dict:
        return {**model.info(), "max_batch_tokens": options.max_batch_tokens,
                "max_client_batch_size": options.max_client_batch_size, "max_batch_requests": None,
                "max_concurrent_requests": options.max_concurrent_requests,
                "tokenization_workers": options.tokenization_workers,
                "auto_truncate": options.truncation == "truncate", "payload_limit": options.payload_limit,
                "version": _version()}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus() -> str:
        return service.metrics.render(service.batcher.queue_size())


_SCHEMAS = {"embed": EmbedRequest, "embed_sparse": EmbedSparseRequest, "similarity": SimilarityRequest,
            "predict": PredictRequest, "rerank": RerankRequest, "fill-mask": FillMaskRequest, "tag": TagRequest}


def _validated(schema, body: dict):

    try:
        return schema.model_validate(body)
    except ValidationError as e:
        raise RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in e.errors()]) from e


class Gate:
    """ASGI middleware, before anything else: the API key on model routes (401), the cap on requests in flight
    (429, TEI's "Overloaded"), and TEI's timing headers on every answer."""

    def __init__(self, app, service: Service):
        self.app, self.service, self.in_flight = app, service, 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        options, path = self.service.options, scope["path"]
        async def counted(message):  # every answer is counted here, by route and status
            if message["type"] == "http.response.start":
                self.service.metrics.count(path, message["status"])
            await send(message)

        if options.api_key and not (scope["method"] == "GET" and path in OPEN_ROUTES):
            given = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
            if given != f"Bearer {options.api_key}":
                return await _reply(counted, 401, "a valid 'Authorization: Bearer <key>' header is required",
                                    "Unauthorized")
        if self.in_flight >= options.max_concurrent_requests:
            return await _reply(counted, 429, f"the server has {self.in_flight} requests in flight, its maximum: "
                                "retry", "Overloaded")
        self.in_flight += 1
        timings, started = {}, time.perf_counter()
        _timings.set(timings)

        async def send_with_timings(message):
            if message["type"] == "http.response.start" and "tokens" in timings:
                headers = list(message.get("headers", []))
                headers += [(f"x-{name}".encode(), str(value).encode()) for name, value in _headers(timings, started)]
                message = {**message, "headers": headers}
            await counted(message)

        try:
            return await self.app(scope, receive, send_with_timings)
        finally:
            self.in_flight -= 1


def _headers(timings: dict, started: float) -> list[tuple[str, int]]:
    """TEI's timing headers, in milliseconds (x-compute-tokens: the real tokens of the request)."""
    def ms(seconds: float) -> int:
        return int(round(seconds * 1000))

    compute = timings.get("tokenization", 0.0) + timings["inference"]
    return [("compute-time", ms(compute)), ("compute-tokens", timings["tokens"]),
            ("queue-time", ms(timings["queue"])), ("inference-time", ms(timings["inference"])),
            ("tokenization-time", ms(timings.get("tokenization", 0.0))),
            ("total-time", ms(time.perf_counter() - started))]


class BodyGuard:
    """ASGI middleware: a request body over `limit` bytes answers 413 before it is read whole; a body that is not
    strict UTF-8 JSON answers 400 (not a traceback): invalid UTF-8, malformed or too deeply nested JSON, NaN or
    Infinity, an integer too long to read, a lone UTF-16 surrogate."""

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
        problem = _json_problem(body)
        if problem is not None:
            return await _reply(send, 400, problem, "Validation")
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


def _json_problem(body: bytes) -> str | None:
    """Why `body` is not strict JSON, or None."""
    def no_constants(name: str):
        raise ValueError(f"{name} is not JSON")

    try:
        parsed = json.loads(body.decode("utf-8"), parse_constant=no_constants)
        json.dumps(parsed, ensure_ascii=False).encode("utf-8")  # a lone surrogate cannot be encoded
    except UnicodeDecodeError as e:
        return f"the body is not valid UTF-8 (byte {e.start})"
    except UnicodeEncodeError:
        return "the body holds a lone UTF-16 surrogate (\\ud800-\\udfff), which is not text"
    except json.JSONDecodeError as e:
        return f"malformed JSON: {e}"
    except RecursionError:
        return "the JSON is nested too deeply"
    except ValueError as e:  # NaN / Infinity, an integer of more digits than Python reads
        return f"malformed JSON: {e}"
    return None


async def _reply(send, status: int, message: str, error_type: str) -> None:
    payload = json.dumps({"error": message, "error_type": error_type}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


class Metrics:
    """Prometheus counters and histograms of one server (its own registry: several apps can live in one process).
    Requests are counted by route; paths that are no route count as one ("other"), so made-up URLs add nothing."""

    KNOWN = {"/", "/invocations", "/embed", "/embed_all", "/embed_sparse", "/similarity", *OPENAI_ROUTES,
             "/predict", "/rerank", "/tokenize", "/decode", "/fill-mask", "/tag", "/health", "/ping", "/info",
             "/metrics"}

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
        self.requests.labels(route=route if route in self.KNOWN else "other", status=str(status)).inc()

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


HEAD_TIMEOUT = 10.0  # seconds a connection has to send a whole request head


def _head_deadline_protocol():
    """uvicorn's h11 protocol with a deadline for each request head: uvicorn cancels its keep-alive timer on any
    byte and sets none on a new connection, so a client sending a byte a second held a connection (and a socket)
    forever. Here a connection that has not sent a whole request head within HEAD_TIMEOUT seconds of opening, or of
    its previous answer, is closed."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeadDeadline(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:  # the head is in: the request is the app's now
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._head_deadline = self.loop.call_later(HEAD_TIMEOUT, self._head_timed_out)

        def _disarm(self) -> None:
            deadline = getattr(self, "_head_deadline", None)
            if deadline is not None:
                deadline.cancel()
                self._head_deadline = None

        def _head_timed_out(self) -> None:
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return HeadDeadline


def serve(model_dir: str, host: str = "127.0.0.1", port: int = 8080, options: ServeOptions | None = None,
          log_level: str = "info") -> None:
    import uvicorn

    options = options or ServeOptions()
    batcher = Batcher(lambda: ServedModel(model_dir, options), options.max_batch_tokens)
    model = batcher.model
    print(f"unmask serve: {model.name} ({model.head}; routes {', '.join('/' + r for r in model.routes)}) "
          f"on http://{host}:{port}", flush=True)
    uvicorn.run(create_app(batcher, options), host=host, port=port, log_level=log_level, timeout_keep_alive=5,
                timeout_graceful_shutdown=options.graceful_timeout, http=_head_deadline_protocol())

