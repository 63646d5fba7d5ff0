"""The HTTP frontend: OpenAI's API over the ring (a FastAPI app).

Blink §3 (the DPU frontend: "HTTP parsing/validation, ring buffer coordination, SSE streaming,
tokenization") and DESIGN.md §2, §8. ``create_app`` takes a ``RingClient`` — never an engine —
so everything here is what a SmartNIC could do: parse and check the request, turn text into
token ids, write them into a ring slot, and turn the ids that appear in the slot back into text.

    POST /v1/completions        text (or token ids) in, text out; streamed as SSE with stream=true
    POST /v1/chat/completions   messages in, rendered with the model's chat template
    GET  /v1/models             the one model this server runs
    GET  /health                200 when the engine is ready; 503 starting / stalled / dead;
                                the body shows ring occupancy and KV blocks
    GET  /metrics               Prometheus text (``metrics.py``)

Errors use OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``:

    400  malformed JSON, a wrong type, a value out of range, a prompt that does not fit the
         context, an empty conversation, n != 1, an unsupported parameter
    401  ``--api-key`` is set and the request lacks ``Authorization: Bearer <key>``
    404  an unknown model name (or path)
    413  a body larger than ``max_body_bytes``
    429  the ring is full, or ``max_queue`` requests are already in it; the ``Retry-After``
         header says how many seconds to wait before trying again
    503  the engine process is dead; 500 the engine failed this request (or a bug)

Requests that arrive while the engine is still loading are accepted: they wait in the ring, and
the engine claims them when its loop starts (that is what the ring is for).

A streamed request that fails after its first byte cannot change its status code any more: it
gets a ``data: {"error": ...}`` event, then ``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import hmac
import time
import uuid
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from itertools import count

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException

from ..config import SamplingParams
from ..model.tokenizer import Tokenizer
from ..ring.client import RingClient, RingFull
from .health import EngineWatch
from .metrics import ServeMetrics
from .protocol import (ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest,
                       ChatCompletionResponse, ChatDelta, ChatMessageOut, CompletionChoice,
                       CompletionRequest, CompletionResponse, ErrorBody, ErrorResponse,
                       ModelCard, ModelList, SamplingFields, Usage)
from .stream import EngineFailed, RequestStream, SlotReaper

DISCONNECT_CHECK_S = 0.1  # how often a non-streamed request looks for its client hanging up


@dataclass(frozen=True)
class ServeSettings:
    model_name: str  # the name clients send as `model`
    max_model_len: int  # prompt + max_tokens must fit in it (the model's context, the KV pool)
    max_output_tokens: int  # the ring's output arena: the most tokens one request can get
    vocab_size: int  # token-id prompts must lie in [0, vocab_size)
    max_queue: int  # most requests in the ring at once; beyond it: 429
    api_key: str | None = None
    max_body_bytes: int = 1 << 20
    poll_interval_s: float = 0.001  # the frontend's ring polling period (Blink §3's t_poll)
    retry_after_s: int = 1  # the Retry-After of a 429


class APIError(Exception):
    """Any error answered to the client, in OpenAI's shape."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers=None):
        super().__init__(message)
        self.status, self.headers = status, headers
        self.body = ErrorResponse(error=ErrorBody(message=message, type=type, param=param,
                                                  code=code))


def create_app(client: RingClient, tokenizer: Tokenizer, settings: ServeSettings,
               watch: EngineWatch) -> FastAPI:
    """The app. ``watch`` says whether the engine lives; its ``run`` and the slot reaper run as
    background tasks for as long as the app is served."""
    metrics = ServeMetrics(client.occupancy, watch.kv_blocks, watch.scheduler_counts)
    reaper = SlotReaper(client)
    request_ids = count(1)
    started = int(time.time())

    @asynccontextmanager
    async def lifespan(app):
        tasks = [asyncio.create_task(watch.run()), asyncio.create_task(reaper.run())]
        yield
        for task in tasks:
            task.cancel()

    app = FastAPI(title="blink_edu", lifespan=lifespan)

    @app.exception_handler(APIError)
    async def api_error(request, err: APIError):
        return JSONResponse(err.body.model_dump(), err.status, headers=err.headers)

    @app.exception_handler(Exception)
    async def internal_error(request, err: Exception):  # a bug: still answer in OpenAI's shape
        return JSONResponse(ErrorResponse(error=ErrorBody(
            message=f"internal error: {type(err).__name__}", type="server_error")).model_dump(),
            500)

    @app.exception_handler(HTTPException)
    async def http_error(request, err: HTTPException):  # unknown paths, wrong methods
        return JSONResponse(ErrorResponse(error=ErrorBody(
            message=str(err.detail), type="invalid_request_error")).model_dump(), err.status_code)

    def start(body: SamplingFields, prompt_ids: list[int],
              max_tokens: int | None) -> RequestStream:
        """Check what both endpoints share, then write the request into the ring."""
        check_common(body, settings)
        params = sampling_params(body, resolve_max_tokens(max_tokens, len(prompt_ids), settings))
        if not watch.alive:
            raise APIError(503, "the engine is not running", "server_error",
                           code="engine_unavailable")
        stream = RequestStream(client, tokenizer, prompt_ids, params, body.stop_strings(),
                               next(request_ids), reaper=reaper,
                               engine_alive=lambda: watch.alive, metrics=metrics,
                               poll_interval_s=settings.poll_interval_s)
        submit(stream, client, settings)
        return stream

    @app.post("/v1/completions")
    async def completions(request: Request):
        check_api_key(request, settings)
        body = await read_body(request, CompletionRequest, settings.max_body_bytes)
        if body.echo:
            raise APIError(400, "echo is not supported", param="echo")
        prompt_ids = completion_prompt(body.prompt, tokenizer, settings.vocab_size)
        stream = start(body, prompt_ids, body.max_tokens)
        reply = CompletionReply(stream, settings.model_name)
        if body.stream:
            return SSEResponse(reply.events(include_usage(body)))
        return await reply.whole(request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        check_api_key(request, settings)
        body = await read_body(request, ChatCompletionRequest, settings.max_body_bytes)
        prompt_ids = chat_prompt(body, tokenizer)
        max_tokens = (body.max_completion_tokens if body.max_completion_tokens is not None
                      else body.max_tokens)
        stream = start(body, prompt_ids, max_tokens)
        reply = ChatReply(stream, settings.model_name)
        if body.stream:
            return SSEResponse(reply.events(include_usage(body)))
        return await reply.whole(request)

    @app.get("/v1/models")
    async def models(request: Request):
        check_api_key(request, settings)
        return ModelList(data=[ModelCard(id=settings.model_name, created=started,
                                         max_model_len=settings.max_model_len)])

    @app.get("/health")
    async def health():
        state = watch.refresh()
        kv = watch.kv_blocks()
        detail = {"status": state, "engine_pid": watch.pid,
                  "ring": {"name": client.ring.name, "slots": client.occupancy()},
                  "kv_blocks": None if kv is None else {"used": kv[0], "total": kv[1]}}
        return JSONResponse(detail, 200 if state == "ready" else 503)

    @app.get("/metrics")
    async def prometheus():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


# --- reading and checking a request ----------------------------------------------------------


def check_api_key(request: Request, settings: ServeSettings) -> None:
    if settings.api_key is None:
        return
    given = request.headers.get("authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {settings.api_key}".encode()):
        raise APIError(401, "missing or wrong API key (send 'Authorization: Bearer <key>')",
                       code="invalid_api_key")


async def read_body(request: Request, model: type[BaseModel], limit: int):
    """The JSON body as ``model``, reading at most ``limit`` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large(limit)
    try:
        return model.model_validate_json(bytes(body))
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        more = f" (and {err.error_count() - 1} more errors)" if err.error_count() > 1 else ""
        raise APIError(400, f"{where + ': ' if where else ''}{first['msg']}{more}",
                       param=where or None) from None


def too_large(limit: int) -> APIError:
    return APIError(413, f"request body larger than {limit} bytes", code="body_too_large")


def check_common(body: SamplingFields, settings: ServeSettings) -> None:
    if body.model is not None and body.model != settings.model_name:
        raise APIError(404, f"the model {body.model!r} does not exist; this server runs "
                            f"{settings.model_name!r}", param="model", code="model_not_found")
    if body.n != 1:
        raise APIError(400, f"n={body.n}: only n=1 is supported (send n requests instead)",
                       param="n")
    if body.logprobs:
        raise APIError(400, "logprobs are not supported", param="logprobs")
    if not all(body.stop_strings()):
        raise APIError(400, "stop strings must not be empty", param="stop")


def completion_prompt(prompt, tokenizer: Tokenizer, vocab_size: int) -> list[int]:
    """A completions prompt as token ids: text, token ids, or a list holding one text."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        if len(prompt) != 1:
            raise APIError(400, f"{len(prompt)} prompts in one request; send one per request",
                           param="prompt")
        prompt = prompt[0]
    ids = tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
    if not ids:
        raise APIError(400, "the prompt is empty", param="prompt")
    if not all(0 <= t < vocab_size for t in ids):
        raise APIError(400, f"token ids must lie in [0, {vocab_size})", param="prompt")
    return ids


def chat_prompt(body: ChatCompletionRequest, tokenizer: Tokenizer) -> list[int]:
    """The conversation rendered with the model's chat template, as token ids."""
    try:
        text = tokenizer.apply_chat_template([m.as_template_dict() for m in body.messages])
    except ValueError as err:  # TokenizerError is a ValueError too
        raise APIError(400, str(err), param="messages") from None
    return tokenizer.encode(text)


def resolve_max_tokens(requested: int | None, prompt_len: int, settings: ServeSettings) -> int:
    """``max_tokens``, checked against the context left after the prompt (None: all of it)."""
    room = min(settings.max_model_len - prompt_len, settings.max_output_tokens)
    if room < 1:
        raise APIError(400, f"the prompt has {prompt_len} tokens; this model's context is "
                            f"{settings.max_model_len} tokens, prompt and completion together",
                       param="prompt", code="context_length_exceeded")
    if requested is None:
        return room
    if not 1 <= requested <= room:
        raise APIError(400, f"max_tokens={requested} must be between 1 and {room} (the "
                            f"prompt has {prompt_len} of the {settings.max_model_len}-token "
                            f"context; one request gets at most {settings.max_output_tokens})",
                       param="max_tokens")
    return requested


def sampling_params(body: SamplingFields, max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=body.temperature, top_p=body.top_p,
                          top_k=max(body.top_k, 0), max_tokens=max_tokens, seed=body.seed,
                          ignore_eos=body.ignore_eos)


def submit(stream: RequestStream, client: RingClient, settings: ServeSettings) -> None:
    """Write the request into a ring slot, or answer 429 when there is no room."""
    busy = client.ring.layout.num_slots - client.occupancy()["EMPTY"]
    if busy >= settings.max_queue:
        raise ring_full(f"{busy} requests are already queued (--max-queue)", settings)
    try:
        stream.submit()
    except RingFull as err:
        raise ring_full(str(err), settings) from None
    except ValueError as err:
        raise APIError(400, str(err)) from None


def ring_full(why: str, settings: ServeSettings) -> APIError:
    return APIError(429, f"server busy: {why}; retry after {settings.retry_after_s} s",
                    "rate_limit_error", code="ring_full",
                    headers={"Retry-After": str(settings.retry_after_s)})


def include_usage(body: SamplingFields) -> bool:
    return body.stream_options is not None and body.stream_options.include_usage


# --- answering ------------------------------------------------------------------------------


class SSEResponse(StreamingResponse):
    """Server-sent events. Closes its event generator however the response ends (done, client
    gone, server shutting down), so the request's ``finally`` runs and its slot is freed."""

    def __init__(self, events):
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache"})

    async def stream_response(self, send) -> None:
        try:
            await super().stream_response(send)
        finally:
            await self.body_iterator.aclose()


def sse(payload: BaseModel) -> str:
    return f"data: {payload.model_dump_json(exclude_none=True)}\n\n"


class Reply:
    """What the two endpoints share: run the stream to the end (``whole``), or as SSE events
    (``events``); the subclasses say how a piece, the end and the whole answer look."""

    def __init__(self, stream: RequestStream, model: str):
        self.stream, self.model = stream, model
        self.id, self.created = f"{self.id_prefix}-{uuid.uuid4().hex}", int(time.time())

    def usage(self) -> Usage:
        prompt, completion = len(self.stream.prompt_ids), self.stream.completion_tokens
        return Usage(prompt_tokens=prompt, completion_tokens=completion,
                     total_tokens=prompt + completion)

    async def whole(self, request: Request):
        """The whole answer at once. A client that hangs up meanwhile (its HTTP disconnect
        arrives while we wait) cancels the request: its slot and KV blocks are freed now, not
        when the last token is done."""
        collect = asyncio.ensure_future(self._collect())
        try:
            while not collect.done():
                await asyncio.wait({collect}, timeout=DISCONNECT_CHECK_S)
                if not collect.done() and await request.is_disconnected():
                    collect.cancel()  # closes the text generator: its finally cancels the slot
                    return Response(status_code=499)  # nobody is listening any more
            text = collect.result()
        except EngineFailed as err:
            raise APIError(500, str(err), "server_error", code="engine_error") from None
        finally:
            collect.cancel()
        return self.answer(text)

    async def _collect(self) -> str:
        async with aclosing(self.stream.text()) as pieces:
            return "".join([piece async for piece in pieces])

    async def events(self, with_usage: bool):
        try:
            async with aclosing(self.stream.text()) as pieces:
                if self.first() is not None:
                    yield sse(self.first())
                async for piece in pieces:
                    yield sse(self.piece(piece))
            yield sse(self.last())
            if with_usage:
                yield sse(self.usage_chunk())
        except EngineFailed as err:
            yield sse(ErrorResponse(error=ErrorBody(message=str(err), type="server_error",
                                                    code="engine_error")))
        yield "data: [DONE]\n\n"


class CompletionReply(Reply):
    id_prefix = "cmpl"

    def chunk(self, text: str, finish_reason: str | None = None) -> CompletionResponse:
        return CompletionResponse(id=self.id, created=self.created, model=self.model,
                                  choices=[CompletionChoice(text=text,
                                                            finish_reason=finish_reason)])

    def first(self):
        return None  # completions start with the first text; chat first sends the role

    def piece(self, text: str):
        return self.chunk(text)

    def last(self):
        return self.chunk("", self.stream.finish_reason)

    def usage_chunk(self):
        return CompletionResponse(id=self.id, created=self.created, model=self.model,
                                  choices=[], usage=self.usage())

    def answer(self, text: str) -> CompletionResponse:
        whole = self.chunk(text, self.stream.finish_reason)
        whole.usage = self.usage()
        return whole


class ChatReply(Reply):
    id_prefix = "chatcmpl"

    def chunk(self, delta: ChatDelta, finish_reason: str | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.id, created=self.created, model=self.model,
                                   choices=[ChatChunkChoice(delta=delta,
                                                            finish_reason=finish_reason)])

    def first(self):
        return self.chunk(ChatDelta(role="assistant", content=""))

    def piece(self, text: str):
        return self.chunk(ChatDelta(content=text))

    def last(self):
        return self.chunk(ChatDelta(), self.stream.finish_reason)

    def usage_chunk(self):
        return ChatCompletionChunk(id=self.id, created=self.created, model=self.model,
                                   choices=[], usage=self.usage())

    def answer(self, text: str) -> ChatCompletionResponse:
        return ChatCompletionResponse(
            id=self.id, created=self.created, model=self.model, usage=self.usage(),
            choices=[ChatChoice(message=ChatMessageOut(content=text),
                                finish_reason=self.stream.finish_reason)])
