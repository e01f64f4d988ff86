"""The HTTP API: OpenAI-compatible completions and chat (with SSE streaming), model listing,
health, readiness, status and Prometheus metrics.

Thin shell over worker.runtime.Worker: parse (protocol.py), tokenize, submit a Job,
relay its events. Errors leave in OpenAI's shape {"error": {message, type, param,
code}} where `code` is the worker's PascalCase reason. Called by `python -m worker`
(uvicorn) and tests.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .errors import InvalidRequest, WorkerError
from .protocol import COMPLETION_DEFAULT_MAX_TOKENS, parse_chat, parse_completion
from .runtime import ServedModel, Worker
from .scheduler import ErrorEvent, Event, FinishEvent, TokenEvent


def error_response(error: WorkerError) -> JSONResponse:
    headers = {}
    retry_after = getattr(error, "retry_after_s", None)
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    body = {"error": {"message": error.message, "type": error.error_type, "param": error.param,
                      "code": error.reason}}
    return JSONResponse(body, status_code=error.status, headers=headers)


def create_app(worker: Worker) -> FastAPI:
    app = FastAPI(title="gpushare worker", docs_url=None, redoc_url=None)

    @app.exception_handler(WorkerError)
    async def _worker_error(request: Request, error: WorkerError) -> JSONResponse:
        model = getattr(request.state, "model", "")
        worker.metrics.reject(model, error.status, error.reason)
        return error_response(error)

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        ready, body = worker.readiness()
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/status")
    async def status() -> dict:
        return worker.status()

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(worker.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [_model_card(worker, name) for name in sorted(worker.served)]}

    @app.get("/v1/models/{name}")
    async def model(name: str) -> dict:
        worker.lookup(name)
        return _model_card(worker, name)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        parsed = parse_completion(await _json(request))
        request.state.model = parsed.model
        served = worker.lookup(parsed.model)
        prompt_ids = served.encode(parsed.prompt) if isinstance(parsed.prompt, str) else list(parsed.prompt)
        generation = worker.generation(served, prompt_ids, max_tokens=parsed.sampling.max_tokens,
                                       default_max_tokens=COMPLETION_DEFAULT_MAX_TOKENS, prompt_param="prompt",
                                       **parsed.sampling.as_kwargs())
        relay = _Relay(worker, served, generation)
        shape = _CompletionShape(parsed.model)
        if parsed.stream:
            return _sse(relay, shape, parsed.include_usage)
        return JSONResponse(await _collect(relay, shape))

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        parsed = parse_chat(await _json(request))
        request.state.model = parsed.model
        served = worker.lookup(parsed.model)
        generation = worker.generation(served, served.chat_prompt(parsed.messages),
                                       max_tokens=parsed.sampling.max_tokens, default_max_tokens=None,
                                       prompt_param="messages", **parsed.sampling.as_kwargs())
        relay = _Relay(worker, served, generation)
        shape = _ChatShape(parsed.model)
        if parsed.stream:
            return _sse(relay, shape, parsed.include_usage)
        return JSONResponse(await _collect(relay, shape))

    return app


async def _json(request: Request) -> object:
    try:
        return json.loads(await request.body())
    except ValueError as exc:
        raise InvalidRequest("InvalidJSON", f"the request body is not valid JSON: {exc}") from exc


def _model_card(worker: Worker, name: str) -> dict:
    model = worker.config.model(name)
    return {"id": name, "object": "model", "created": worker.started_at, "owned_by": model.namespace,
            "max_model_len": model.context_tokens, "mode": model.mode}


class _Relay:
    """Submits a generation and yields its events on the event loop (the executor thread pushes them)."""

    def __init__(self, worker: Worker, served: ServedModel, generation):
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.job = worker.submit(served.config.name, generation,
                                 lambda event: self.loop.call_soon_threadsafe(self.queue.put_nowait, event))

    async def events(self) -> AsyncIterator[Event]:
        try:
            while True:
                event = await self.queue.get()
                yield event
                if not isinstance(event, TokenEvent):
                    return
        finally:
            self.job.cancelled = True  # a client that went away stops costing device time


class _CompletionShape:
    """/v1/completions objects."""

    chunk_kind = "text_completion"

    def __init__(self, model: str):
        self.id, self.model, self.created = f"cmpl-{uuid.uuid4().hex}", model, int(time.time())

    def chunk(self, text: str, finish: str | None, first: bool) -> dict:
        return self._wrap(self.chunk_kind, [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}])

    def usage_chunk(self, usage: dict) -> dict:
        return {**self._wrap(self.chunk_kind, []), "usage": usage}

    def final(self, text: str, finish: str, usage: dict) -> dict:
        body = self._wrap("text_completion",
                          [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}])
        return {**body, "usage": usage}

    def _wrap(self, kind: str, choices: list) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}


class _ChatShape(_CompletionShape):
    """/v1/chat/completions objects."""

    chunk_kind = "chat.completion.chunk"

    def __init__(self, model: str):
        super().__init__(model)
        self.id = f"chatcmpl-{uuid.uuid4().hex}"

    def chunk(self, text: str, finish: str | None, first: bool) -> dict:
        delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
        return self._wrap(self.chunk_kind, [{"index": 0, "delta": delta, "logprobs": None,
                                                     "finish_reason": finish}])

    def final(self, text: str, finish: str, usage: dict) -> dict:
        body = self._wrap("chat.completion", [{"index": 0, "message": {"role": "assistant", "content": text},
                                               "logprobs": None, "finish_reason": finish}])
        return {**body, "usage": usage}


def _usage(finish: FinishEvent) -> dict:
    return {"prompt_tokens": finish.prompt_tokens, "completion_tokens": finish.completion_tokens,
            "total_tokens": finish.prompt_tokens + finish.completion_tokens}


async def _collect(relay: _Relay, shape: _CompletionShape) -> dict:
    parts = []
    async for event in relay.events():
        if isinstance(event, TokenEvent):
            parts.append(event.text)
        elif isinstance(event, ErrorEvent):
            raise event.error
        else:
            return shape.final("".join(parts), event.reason, _usage(event))
    raise AssertionError("the event stream ended without a finish event")


def _sse(relay: _Relay, shape: _CompletionShape, include_usage: bool) -> StreamingResponse:
    def frame(payload: dict | str) -> str:
        return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"

    async def body() -> AsyncIterator[str]:
        first = True
        async for event in relay.events():
            if isinstance(event, TokenEvent):
                yield frame(shape.chunk(event.text, None, first))
                first = False
            elif isinstance(event, ErrorEvent):
                error = event.error
                yield frame({"error": {"message": error.message, "type": error.error_type, "param": None,
                                       "code": error.reason}})
            else:
                yield frame(shape.chunk("", event.reason, first))
                if include_usage:
                    yield frame(shape.usage_chunk(_usage(event)))
        yield frame("[DONE]")

    return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
