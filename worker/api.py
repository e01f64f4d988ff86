"""The HTTP API: OpenAI-compatible completions and chat (with SSE streaming), model listing,
health, readiness, status, Prometheus metrics, and its OpenAPI description
(schemas/worker-api.openapi.json at /openapi.json).

Thin shell over worker.runtime.Worker: bound the body (BodyLimit), decode JSON and
tokenise in a worker thread (never on the event loop), parse (protocol.py), compile a
response_format or tools grammar on the model's compile lane (grammar.py), submit one Job per
requested choice (`n`), relay their events, and shape them as OpenAI objects
(responses.py; tools.py when tool calls may come back). Every error leaves in OpenAI's
shape {"error": {message, type, param, code}} where `code` is the worker's PascalCase
reason: client mistakes are 4xx, unknown routes 404 and wrong methods 405 in that shape
too. Called by `python -m worker` (uvicorn) and tests.
"""
from __future__ import annotations

import asyncio
import json
from collections import deque
from typing import AsyncIterator, Sequence

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import schemas

from .auth import access_of as _access
from .auth import require_all, visible_health, visible_readiness, visible_status
from .errors import InvalidRequest, RequestTooLarge, SchemaRefused, WorkerError
from .protocol import COMPLETION_DEFAULT_MAX_TOKENS, Sampling, parse_chat, parse_completion
from .responses import ChatShape, CompletionShape
from .tools import ToolCallShape
from .runtime import ServedModel, Worker
from .events import ErrorEvent, Event, FinishEvent, TokenEvent

MAX_JSON_DEPTH = 64  # nested objects/arrays in a request body; OpenAI bodies need fewer than 10
_HTTP_REASONS = {404: "NotFound", 405: "MethodNotAllowed"}
_INLINE_JSON_BYTES = 64 << 10  # smaller bodies decode on the event loop: a thread hop would cost more


def error_body(error: WorkerError) -> dict:
    return {"error": {"message": error.message, "type": error.error_type, "param": error.param, "code": error.reason}}


def error_response(error: WorkerError, headers: dict | None = None) -> JSONResponse:
    headers = dict(headers or {})
    retry_after = getattr(error, "retry_after_s", None)
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    return JSONResponse(error_body(error), status_code=error.status, headers=headers)


def create_app(worker: Worker, warnings: Sequence[dict] = ()) -> FastAPI:
    """The API over `worker`; `warnings` ({reason, message}: worker.auth_checks) are served on /healthz."""
    app = FastAPI(title="gpushare worker", docs_url=None, redoc_url=None, openapi_url=None)
    keepalive_s = worker.config.sse_keepalive_ms / 1000

    @app.exception_handler(WorkerError)
    async def _worker_error(request: Request, error: WorkerError) -> JSONResponse:
        model = getattr(request.state, "model", "")
        worker.metrics.reject(model, error.status, error.reason)
        if isinstance(error, SchemaRefused):
            worker.metrics.grammar_refused(model, error.limit)
        return error_response(error)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        reason = _HTTP_REASONS.get(exc.status_code, "HTTPError")
        path = request.url.path[:200]
        message = {404: f"no route {path}; the worker serves /v1/models, /v1/completions, /v1/chat/completions, "
                        "/healthz, /readyz, /status, /metrics and /openapi.json",
                   405: f"{request.method} is not allowed on {path}"}.get(exc.status_code, exc.detail)
        error = WorkerError(reason, message)
        error.status, error.error_type = exc.status_code, "invalid_request_error"
        return error_response(error, exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:  # a bug: still OpenAI's shape
        return error_response(WorkerError("InternalError", f"the worker failed: {type(exc).__name__}; see its log"))

    @app.get("/healthz")
    async def healthz(request: Request) -> JSONResponse:
        live, body = worker.health()
        answer = {"status": "ok" if live else "stalled", **visible_health(body, _access(request))}
        if warnings:
            answer["warnings"] = list(warnings)
        return JSONResponse(answer, status_code=200 if live else 503)

    @app.get("/readyz")
    async def readyz(request: Request) -> JSONResponse:
        ready, body = worker.readiness()
        return JSONResponse(visible_readiness(body, _access(request), worker.config.models),
                            status_code=200 if ready else 503)

    @app.get("/readyz/{name}")
    async def model_readyz(request: Request, name: str) -> JSONResponse:
        worker.lookup_config(name, _access(request).allows)
        ready, body = worker.readiness(name)
        return JSONResponse({**body, "model": name, "state": worker.model_state(name)},
                            status_code=200 if ready else 503)

    @app.get("/status")
    async def status(request: Request) -> dict:
        return visible_status(worker.status(), _access(request))

    @app.get("/openapi.json")
    async def openapi() -> JSONResponse:
        return JSONResponse(schemas.document("worker-api.openapi.json"))

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        require_all(_access(request), worker.config.models)
        return Response(generate_latest(worker.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: Request) -> dict:
        access = _access(request)
        return {"object": "list", "data": [_model_card(worker, m.name) for m in sorted(
            worker.config.models, key=lambda m: m.name)
            if worker.model_state(m.name) != "refused" and access.allows(m.namespace, m.name)]}

    @app.get("/v1/models/{name:path}")
    async def model(request: Request, name: str) -> dict:
        worker.lookup_config(name, _access(request).allows)
        if worker.model_state(name) == "refused":
            worker.lookup(name)  # raises 503 with the refusal's reason
        return _model_card(worker, name)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        parsed = parse_completion(await _json(request))
        request.state.model = parsed.model
        served = worker.lookup(parsed.model, _access(request).allows)
        _check_fanout(worker, served, parsed.n, parsed.sampling)
        if isinstance(parsed.prompt, str):
            prompt_ids = await asyncio.to_thread(served.prompts.encode, parsed.prompt)
        else:
            await asyncio.to_thread(served.prompts.check_ids, parsed.prompt, "prompt")
            prompt_ids = list(parsed.prompt)
        generations = [worker.generation(served, prompt_ids, max_tokens=parsed.sampling.max_tokens,
                                         default_max_tokens=COMPLETION_DEFAULT_MAX_TOKENS, prompt_param="prompt",
                                         **parsed.sampling.as_kwargs(i)) for i in range(parsed.n)]
        shape = CompletionShape(parsed.model, _token_texts(served), parsed.sampling.logprobs is not None)
        relay = _Relay(worker, served, generations, per_token=parsed.stream)
        return await _respond(request, relay, shape, parsed.stream, parsed.include_usage, keepalive_s)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        parsed = parse_chat(await _json(request))
        request.state.model = parsed.model
        served = worker.lookup(parsed.model, _access(request).allows)
        _check_fanout(worker, served, parsed.n, parsed.sampling)
        prompt_ids = await asyncio.to_thread(served.prompts.chat, parsed.messages, parsed.tools)
        structure = parsed.structure
        constraints = (await served.grammars.compiled(structure, parsed.n, worker.metrics) if structure
                       else [None] * parsed.n)
        generations = [worker.generation(served, prompt_ids, max_tokens=parsed.sampling.max_tokens,
                                         default_max_tokens=None, prompt_param="messages", constraint=constraint,
                                         **parsed.sampling.as_kwargs(i)) for i, constraint in enumerate(constraints)]
        shape = (ToolCallShape if structure and structure.tools else ChatShape)(
            parsed.model, _token_texts(served), parsed.sampling.logprobs is not None)
        relay = _Relay(worker, served, generations, per_token=parsed.stream)
        return await _respond(request, relay, shape, parsed.stream, parsed.include_usage, keepalive_s)

    app.add_middleware(BodyLimit, max_bytes=worker.config.max_request_bytes)
    return app


class BodyLimit:
    """ASGI middleware: reads a request's body up to `max_bytes` before the app sees it, and answers 413
    (OpenAI's error shape) once the declared or received size passes the limit; nothing is parsed.

    The rest of an oversized body (up to DRAIN_BYTES) is read and dropped before answering: a server
    that closes a socket with unread data makes the kernel reset it, and the client never sees the 413.
    """

    DRAIN_BYTES = 64 << 20

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._refuse(scope, receive, send, f"declares {int(declared)} bytes", 0)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left while sending: nobody to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                if not message.get("more_body", False):
                    return await self._refuse(scope, receive, send, f"has {size} bytes", None)
                return await self._refuse(scope, receive, send, f"passed {self.max_bytes} bytes", size)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body: list[Message] = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replay() -> Message:
            return body.pop() if body else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, what: str, drained: int | None) -> None:
        """Answer 413 after reading the rest of the body (`drained` bytes read so far; None: all of it)."""
        while drained is not None and drained <= self.DRAIN_BYTES:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            drained = drained + len(message.get("body", b"")) if message.get("more_body", False) else None
        error = RequestTooLarge("RequestTooLarge", f"the request body {what}; this worker accepts at most "
                                f"{self.max_bytes} bytes (server.maxRequestBytes): shorten the prompt or raise "
                                "the limit")
        await error_response(error, {"Connection": "close"})(scope, _no_receive, send)


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}


async def _json(request: Request) -> object:
    """The decoded body: inline when small (microseconds), else in a worker thread."""
    raw = await request.body()
    return decode_json(raw) if len(raw) <= _INLINE_JSON_BYTES else await asyncio.to_thread(decode_json, raw)


def decode_json(raw: bytes) -> object:
    """The JSON document in `raw`, or InvalidRequest: not JSON, NaN/Infinity, text that is not valid UTF-8
    (lone surrogates), or nesting deeper than MAX_JSON_DEPTH."""
    try:
        document = json.loads(raw, parse_constant=_no_constant)
    except RecursionError as exc:
        raise _too_deep() from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer of more than 4300 digits
        raise InvalidRequest("InvalidJSON", f"the request body is not valid JSON: {str(exc)[:200]}") from exc
    _check_nesting(document)
    return document


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _too_deep() -> InvalidRequest:
    return InvalidRequest("JSONTooDeep", f"the request body nests objects and arrays more than {MAX_JSON_DEPTH} deep; "
                          "OpenAI request bodies need far fewer levels")


def _check_nesting(document: object) -> None:
    if isinstance(document, str):
        _check_text(document)
    stack = [(document, 1)] if isinstance(document, dict | list) else []
    while stack:
        value, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise _too_deep()
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if isinstance(key, str):
                _check_text(key)
            if isinstance(item, dict | list):
                stack.append((item, depth + 1))
            elif isinstance(item, str):
                _check_text(item)


def _check_text(text: str) -> None:
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidRequest("InvalidJSON", "the request body holds a string with a lone UTF-16 surrogate "
                                 f"(\\u{ord(text[exc.start]):04x}), which is not text; send valid UTF-8") from exc


def _check_fanout(worker: Worker, served: ServedModel, n: int, sampling: Sampling) -> None:
    if n > worker.config.max_queued_requests:
        raise InvalidRequest("TooManyChoices", f"n={n} exceeds server.maxQueuedRequests "
                             f"({worker.config.max_queued_requests}): each choice is a request of its own; lower n",
                             param="n")
    served.prompts.check_ids([token for token, _ in sampling.logit_bias], "logit_bias")
    served.prompts.check_ids(sampling.fields["stop_token_ids"], "stop_token_ids")


def _token_texts(served: ServedModel):
    """What each token id decodes to (for logprobs), with the executor's tokenizer: held only briefly."""
    return lambda ids: [served.decode([token]) for token in ids]


def _model_card(worker: Worker, name: str) -> dict:
    model = worker.config.model(name)
    return {"id": name, "object": "model", "created": worker.started_at, "owned_by": model.namespace,
            "max_model_len": model.context_tokens, "mode": model.mode, "state": worker.model_state(name)}


class _Relay:
    """Submits one job per choice and yields (choice index, event) on the event loop as the model's emitter
    hands them over (all of a step's events in one call_soon_threadsafe); None when nothing woke it for
    `idle_s` seconds. `per_token` False (a whole answer): only a finish or an error wakes the handler, so a
    token costs the loop one append, not a pass through the middleware stack."""

    def __init__(self, worker: Worker, served: ServedModel, generations: list, per_token: bool):
        self.per_token = per_token
        self.loop = asyncio.get_running_loop()
        self.pending: deque[tuple[int, Event]] = deque()
        self.due = False  # pending holds what the handler wakes for
        self.waiter: asyncio.Future | None = None
        self.jobs = []
        try:
            for index, generation in enumerate(generations):
                self.jobs.append(worker.submit(served.config.name, generation,
                                               lambda event, index=index: self._push(index, event),
                                               self.loop.call_soon_threadsafe))
        except WorkerError:  # the queue filled part way: the choices already queued are dropped with it
            self.cancel()
            raise

    def _push(self, index: int, event: Event) -> None:
        self.pending.append((index, event))
        if self.per_token or not isinstance(event, TokenEvent):
            self.due = True
            if self.waiter is not None and not self.waiter.done():
                self.waiter.set_result(None)

    async def events(self, idle_s: float) -> AsyncIterator[tuple[int, Event] | None]:
        running = len(self.jobs)
        try:
            while running:
                if not self.due:
                    self.waiter = self.loop.create_future()
                    try:
                        async with asyncio.timeout(idle_s):  # a timer on this task, no task of its own
                            await self.waiter
                    except TimeoutError:
                        yield None
                    finally:
                        self.waiter = None
                self.due = False
                while self.pending:
                    index, event = self.pending.popleft()
                    yield index, event
                    if not isinstance(event, TokenEvent):
                        running -= 1
        finally:
            self.cancel()  # a client that went away stops costing device time

    def cancel(self) -> None:
        for job in self.jobs:
            job.cancelled = True


async def _respond(request: Request, relay: _Relay, shape: CompletionShape, stream: bool, include_usage: bool,
                   keepalive_s: float) -> Response:
    if stream:
        return StreamingResponse(_sse(relay, shape, include_usage, keepalive_s), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    texts: dict[int, list[str]] = {i: [] for i in range(len(relay.jobs))}
    reported: dict[int, list] = {i: [] for i in range(len(relay.jobs))}
    finished: dict[int, FinishEvent] = {}
    async for item in relay.events(keepalive_s):
        if item is None:
            if await request.is_disconnected():
                return Response(status_code=499)  # nobody reads it; the jobs were cancelled
            continue
        index, event = item
        if isinstance(event, TokenEvent):
            texts[index].append(event.text)
            reported[index].extend(event.choices)
        elif isinstance(event, ErrorEvent):
            raise event.error
        else:
            finished[index] = event
    return JSONResponse(shape.final({i: "".join(parts) for i, parts in texts.items()}, reported, finished))


async def _sse(relay: _Relay, shape: CompletionShape, include_usage: bool, keepalive_s: float) -> AsyncIterator[str]:
    def frame(payload: dict | str) -> str:
        return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"

    started: set[int] = set()
    finished: dict[int, FinishEvent] = {}
    async for item in relay.events(keepalive_s):
        if item is None:
            yield ": keep-alive\n\n"  # an SSE comment: clients ignore it, proxies see a live stream
            continue
        index, event = item
        if isinstance(event, TokenEvent):
            yield frame(shape.chunk(index, event.text, event.choices, None, index not in started))
            started.add(index)
        elif isinstance(event, ErrorEvent):
            yield frame(error_body(event.error))
        else:
            finished[index] = event
            yield frame(shape.chunk(index, "", (), event.reason, index not in started))
            started.add(index)
    if include_usage:
        yield frame(shape.usage_chunk(finished))
    yield frame("[DONE]")
