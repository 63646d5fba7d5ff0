"""The HTTP frontend: OpenAI's API over the ring (a FastAPI app).

Blink §3 (the DPU frontend: "HTTP parsing/validation, ring buffer coordination, SSE streaming,
tokenization") and docs/design.md §2, §8. ``create_app`` takes a ``RingClient`` — never an engine —
so everything here is what a SmartNIC could do: parse and check the request, turn text into
token ids, write them into a ring slot, and turn the ids that appear in the slot back into text.

    POST /v1/completions        text (or token ids) in, text out; streamed as SSE with stream=true
    POST /v1/chat/completions   messages in, rendered with the model's chat template
    GET  /v1/models             the one model this server runs
    GET  /v1/models/{id}        that model (404 for any other id)
    GET  /health                200 when the engine is ready; 503 starting / stalled / dead;
                                the body shows ring occupancy, KV blocks, engine restarts
    GET  /metrics               Prometheus text (``metrics.py``)

Errors use OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``:

    400  malformed JSON, a wrong type, a value out of range, a prompt that does not fit the
         context, an empty conversation, a parameter this server does not implement (named:
         ``tools``, ``response_format`` other than text, ...), or one the engine's executor
         cannot honour (the persistent kernel applies no logit_bias or penalties and returns
         no logprobs)
    401  ``--api-key`` is set and the request lacks ``Authorization: Bearer <key>``
    404  an unknown model name (or path)
    413  a body larger than ``max_body_bytes``
    429  the ring is full, or ``max_queue`` requests are already in it; the ``Retry-After``
         header says how many seconds to wait before trying again
    503  the engine process is dead (the server restarts it: ``supervisor.py``); 500 the engine
         failed this request, or died running it (or a bug)

Requests that arrive while the engine is still loading are accepted: they wait in the ring, and
the engine claims them when its loop starts (that is what the ring is for).

A streamed request that fails after its first byte cannot change its status code any more: it
gets a ``data: {"error": ...}`` event, then ``data: [DONE]``.

**Several choices.** ``n`` choices of each of several prompts are ``n x prompts`` ring requests,
run side by side; choice ``i`` of prompt ``p`` has index ``p * n + i`` (as vLLM numbers them),
and with a ``seed`` it samples from ``seed + i`` (the same seed would give ``n`` equal choices).
Streamed, their chunks interleave as their tokens arrive, each naming its index.
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
from .protocol import (UNSUPPORTED, ChatChoice, ChatChunkChoice, ChatCompletionChunk,
                       ChatCompletionRequest, ChatCompletionResponse, ChatDelta, ChatLogprobs,
                       ChatMessageOut, ChatTokenLogprob, CompletionChoice, CompletionLogprobs,
                       CompletionRequest, CompletionResponse, ErrorBody, ErrorResponse,
                       ModelCard, ModelList, SamplingFields, TopLogprob, Usage)
from .stream import EngineFailed, RequestStream, SlotReaper
from .supervisor import EngineSupervisor

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
    max_logprobs: int = 0  # top logprobs per token a request may ask for (the ring's width)
    max_logit_bias: int = 64  # logit_bias entries a request may carry (the ring's width)
    # None: the engine returns logprobs; else the name of the executor that does not (the
    # persistent kernel samples on the GPU and publishes tokens only)
    no_logprobs: str | None = None


class APIError(Exception):
    """Any error answered to the client, in OpenAI's shape."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers=None):
        super().__init__(message)
        self.status, self.headers = status, headers
        self.body = ErrorResponse(error=ErrorBody(message=message, type=type, param=param,
                                                  code=code))


def create_app(client: RingClient, tokenizer: Tokenizer, settings: ServeSettings,
               watch: EngineWatch, supervisor: EngineSupervisor | None = None) -> FastAPI:
    """The app. ``watch`` says whether the engine lives; its ``run`` (or, with a
    ``supervisor``, the supervisor's: it restarts a dead engine) and the slot reaper run as
    background tasks for as long as the app is served."""
    metrics = ServeMetrics(client.occupancy, watch.kv_blocks, watch.scheduler_counts,
                           lambda: watch.restarts, watch.preemptions)
    reaper = SlotReaper(client)
    request_ids = count(1)
    started = int(time.time())

    @asynccontextmanager
    async def lifespan(app):
        watching = (supervisor.run(on_reset=reaper.forget_all) if supervisor is not None
                    else watch.run())
        tasks = [asyncio.create_task(watching), asyncio.create_task(reaper.run())]
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

    def start(body: SamplingFields, prompts: list[list[int]],
              max_tokens: int | None) -> list[RequestStream]:
        """Check what both endpoints share, then write ``n`` requests per prompt into the ring
        (all or none: if one does not fit, those already written are cancelled)."""
        check_common(body, settings, len(prompts))
        bias = logit_bias(body, settings)
        plans = [(prompt, sampling_params(body, resolve_max_tokens(max_tokens, len(prompt),
                                                                   settings), i, bias))
                 for prompt in prompts for i in range(body.n)]
        if not watch.alive:
            raise APIError(503, "the engine is not running", "server_error",
                           code="engine_unavailable")
        streams, generation = [], watch.generation
        try:
            for prompt, params in plans:
                stream = RequestStream(client, tokenizer, prompt, params, body.stop_strings(),
                                       next(request_ids), reaper=reaper,
                                       engine_alive=lambda: watch.alive_for(generation),
                                       metrics=metrics, poll_interval_s=settings.poll_interval_s)
                submit(stream, client, settings)
                streams.append(stream)
        except APIError:
            for stream in streams:
                reaper.add(stream.slot)
            raise
        return streams

    @app.post("/v1/completions")
    async def completions(request: Request):
        check_api_key(request, settings)
        body = await read_body(request, CompletionRequest, settings.max_body_bytes)
        check_completion(body)
        prompts = completion_prompts(body.prompt, tokenizer, settings.vocab_size)
        streams = start(body, prompts, body.max_tokens)
        echo = [tokenizer.decode(p) if body.echo else "" for p in prompts for _ in range(body.n)]
        reply = CompletionReply(streams, settings.model_name, tokenizer, prompts, echo)
        if body.stream:
            return SSEResponse(reply.events(include_usage(body)))
        return await reply.whole(request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        check_api_key(request, settings)
        body = await read_body(request, ChatCompletionRequest, settings.max_body_bytes)
        if body.top_logprobs is not None and not body.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        prompt = chat_prompt(body, tokenizer)
        max_tokens = (body.max_completion_tokens if body.max_completion_tokens is not None
                      else body.max_tokens)
        streams = start(body, [prompt], max_tokens)
        reply = ChatReply(streams, settings.model_name, tokenizer, [prompt])
        if body.stream:
            return SSEResponse(reply.events(include_usage(body)))
        return await reply.whole(request)

    def model_card() -> ModelCard:
        return ModelCard(id=settings.model_name, created=started,
                         max_model_len=settings.max_model_len)

    @app.get("/v1/models")
    async def models(request: Request):
        check_api_key(request, settings)
        return ModelList(data=[model_card()])

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request):
        check_api_key(request, settings)
        if model_id != settings.model_name:
            raise APIError(404, f"the model {model_id!r} does not exist; this server runs "
                                f"{settings.model_name!r}", param="model",
                           code="model_not_found")
        return model_card()

    @app.get("/health")
    async def health():
        state = watch.refresh()
        kv = watch.kv_blocks()
        detail = {"status": state, "engine_pid": watch.pid, "engine_restarts": watch.restarts,
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


def check_common(body: SamplingFields, settings: ServeSettings, num_prompts: int) -> None:
    if body.model is not None and body.model != settings.model_name:
        raise APIError(404, f"the model {body.model!r} does not exist; this server runs "
                            f"{settings.model_name!r}", param="model", code="model_not_found")
    for name in UNSUPPORTED:
        if getattr(body, name, None) is not None:
            raise APIError(400, f"{name} is not supported by this server", param=name)
    if body.response_format is not None and body.response_format.get("type") != "text":
        raise APIError(400, f"response_format {body.response_format.get('type')!r} is not "
                            f"supported by this server (only 'text')", param="response_format")
    if not all(body.stop_strings()):
        raise APIError(400, "stop strings must not be empty", param="stop")
    if body.n * num_prompts > settings.max_queue:
        raise APIError(400, f"n={body.n} choices of {num_prompts} prompt(s) is more requests "
                            f"than this server queues at once ({settings.max_queue})", param="n")
    logprobs = body.num_logprobs()
    if logprobs is not None and logprobs > settings.max_logprobs:
        raise APIError(400, f"at most {settings.max_logprobs} top logprobs per token "
                            f"(--max-logprobs), got {logprobs}",
                       param="top_logprobs" if hasattr(body, "top_logprobs") else "logprobs")
    if logprobs is not None and settings.no_logprobs:
        raise APIError(400, f"logprobs are not supported by the {settings.no_logprobs} "
                            f"executor this server runs",
                       param="top_logprobs" if hasattr(body, "top_logprobs") else "logprobs")


def check_completion(body: CompletionRequest) -> None:
    """What only completions have: ``best_of`` and ``echo`` with logprobs."""
    if body.best_of is not None and body.best_of != body.n:
        raise APIError(400, f"best_of={body.best_of}: only best_of == n is supported",
                       param="best_of")
    if body.echo and body.logprobs is not None:
        raise APIError(400, "echo with logprobs (the prompt's logprobs) is not supported",
                       param="echo")


def logit_bias(body: SamplingFields, settings: ServeSettings) -> tuple[tuple[int, float], ...]:
    """``logit_bias`` as sorted (token id, bias) pairs, each id checked against the vocabulary."""
    if not body.logit_bias:
        return ()
    if len(body.logit_bias) > settings.max_logit_bias:
        raise APIError(400, f"logit_bias has {len(body.logit_bias)} entries; at most "
                            f"{settings.max_logit_bias}", param="logit_bias")
    pairs = []
    for key, bias in body.logit_bias.items():
        if not key.isdigit() or int(key) >= settings.vocab_size:
            raise APIError(400, f"logit_bias: {key!r} is not a token id in "
                                f"[0, {settings.vocab_size})", param="logit_bias")
        if not -100 <= bias <= 100:
            raise APIError(400, f"logit_bias: the bias of token {key} must be in [-100, 100], "
                                f"got {bias}", param="logit_bias")
        pairs.append((int(key), float(bias)))
    return tuple(sorted(pairs))


def completion_prompts(prompt, tokenizer: Tokenizer, vocab_size: int) -> list[list[int]]:
    """A completions prompt as token ids, one list per prompt: a text, token ids, or a list of
    texts or of token-id lists."""
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        prompt = [prompt]
    if not prompt:
        raise APIError(400, "the prompt is empty", param="prompt")
    prompts = [tokenizer.encode(p) if isinstance(p, str) else p for p in prompt]
    for ids in prompts:
        if not ids:
            raise APIError(400, "the prompt is empty", param="prompt")
        if not all(0 <= t < vocab_size for t in ids):
            raise APIError(400, f"token ids must lie in [0, {vocab_size})", param="prompt")
    return prompts


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


def sampling_params(body: SamplingFields, max_tokens: int, choice: int,
                    bias: tuple[tuple[int, float], ...]) -> SamplingParams:
    """The engine's parameters for choice number ``choice`` (its seed: ``seed + choice``)."""
    seed = None if body.seed is None else (body.seed + choice) % 2**63
    return SamplingParams(temperature=body.temperature, top_p=body.top_p,
                          top_k=max(body.top_k, 0), max_tokens=max_tokens, seed=seed,
                          ignore_eos=body.ignore_eos, presence_penalty=body.presence_penalty,
                          frequency_penalty=body.frequency_penalty, logit_bias=bias,
                          logprobs=body.num_logprobs())


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


Logprobs = list[tuple[int, float, list]]  # (token, logprob, [(token, logprob), ...]) per token


class Reply:
    """What the two endpoints share: run the streams (one per choice) to the end (``whole``),
    or as SSE events (``events``); the subclasses say how a piece, the end and the whole answer
    of a choice look."""

    def __init__(self, streams: list[RequestStream], model: str, tokenizer: Tokenizer,
                 prompts: list[list[int]]):
        self.streams, self.model, self.tokenizer = streams, model, tokenizer
        self.prompt_tokens = sum(len(p) for p in prompts)
        self.id, self.created = f"{self.id_prefix}-{uuid.uuid4().hex}", int(time.time())

    def usage(self) -> Usage:
        completion = sum(s.completion_tokens for s in self.streams)
        return Usage(prompt_tokens=self.prompt_tokens, completion_tokens=completion,
                     total_tokens=self.prompt_tokens + completion)

    def token_text(self, token: int) -> str:
        return self.tokenizer.decode([token], skip_special_tokens=False)

    async def whole(self, request: Request):
        """The whole answer at once. A client that hangs up meanwhile (its HTTP disconnect
        arrives while we wait) cancels the requests: their slots and KV blocks are freed now,
        not when the last token is done."""
        collect = asyncio.ensure_future(asyncio.gather(*(self._collect(s) for s in self.streams)))
        try:
            while not collect.done():
                await asyncio.wait({collect}, timeout=DISCONNECT_CHECK_S)
                if not collect.done() and await request.is_disconnected():
                    collect.cancel()  # closes the text generators: their finally cancels slots
                    return Response(status_code=499)  # nobody is listening any more
            results = collect.result()
        except EngineFailed as err:
            raise APIError(500, str(err), "server_error", code="engine_error") from None
        finally:
            collect.cancel()
        return self.answer(results)

    async def _collect(self, stream: RequestStream) -> tuple[str, Logprobs]:
        async with aclosing(stream.text()) as pieces:
            text = "".join([piece async for piece in pieces])
        return text, stream.take_logprobs()

    async def events(self, with_usage: bool):
        """Every choice's chunks, interleaved as their tokens arrive."""
        arrivals: asyncio.Queue = asyncio.Queue()
        pumps = [asyncio.create_task(self._pump(i, s, arrivals)) for i, s in enumerate(self.streams)]
        try:
            for i in range(len(self.streams)):
                if self.first(i) is not None:
                    yield sse(self.first(i))
            running = len(self.streams)
            while running:
                i, piece, failure = await arrivals.get()
                if failure is not None:
                    raise failure
                if piece is None:  # choice i is done
                    running -= 1
                    yield sse(self.last(i, self.streams[i].take_logprobs()))
                else:
                    yield sse(self.piece(i, piece, self.streams[i].take_logprobs()))
            if with_usage:
                yield sse(self.chunk_with_usage())
        except EngineFailed as err:
            yield sse(ErrorResponse(error=ErrorBody(message=str(err), type="server_error",
                                                    code="engine_error")))
        finally:
            for pump in pumps:
                pump.cancel()  # a choice still running: its text generator cancels its slot
            await asyncio.gather(*pumps, return_exceptions=True)
        yield "data: [DONE]\n\n"

    @staticmethod
    async def _pump(index: int, stream: RequestStream, arrivals: asyncio.Queue) -> None:
        """Forward ``stream``'s pieces to ``arrivals`` as (index, piece, None); then
        (index, None, None) at its end, or (index, None, the EngineFailed) if it failed."""
        try:
            async with aclosing(stream.text()) as pieces:
                async for piece in pieces:
                    arrivals.put_nowait((index, piece, None))
            arrivals.put_nowait((index, None, None))
        except EngineFailed as err:
            arrivals.put_nowait((index, None, err))


class CompletionReply(Reply):
    id_prefix = "cmpl"

    def __init__(self, streams, model, tokenizer, prompts, echo: list[str]):
        super().__init__(streams, model, tokenizer, prompts)
        self.echo = echo  # per choice: the prompt's text when echo is asked, else ""
        self.offsets = [len(e) for e in echo]  # per choice: the text length so far

    def chunk(self, index: int, text: str, finish_reason: str | None = None,
              logprobs: Logprobs = ()) -> CompletionResponse:
        return CompletionResponse(id=self.id, created=self.created, model=self.model,
                                  choices=[self.choice(index, text, finish_reason, logprobs)])

    def choice(self, index: int, text: str, finish_reason: str | None,
               logprobs: Logprobs) -> CompletionChoice:
        wanted = self.streams[index].params.logprobs is not None
        return CompletionChoice(index=index, text=text, finish_reason=finish_reason,
                                logprobs=self.legacy_logprobs(index, logprobs) if wanted else None)

    def legacy_logprobs(self, index: int, logprobs: Logprobs) -> CompletionLogprobs:
        """OpenAI's completions logprobs: parallel lists; text offsets count from the start of
        the choice's text."""
        out = CompletionLogprobs()
        for token, logprob, top in logprobs:
            text = self.token_text(token)
            out.tokens.append(text)
            out.token_logprobs.append(logprob)
            out.top_logprobs.append({self.token_text(t): lp for t, lp in top})
            out.text_offset.append(self.offsets[index])
            self.offsets[index] += len(text)
        return out

    def first(self, index: int):
        if not self.echo[index]:
            return None  # completions start with the first text; chat first sends the role
        return self.chunk(index, self.echo[index])

    def piece(self, index: int, text: str, logprobs: Logprobs):
        return self.chunk(index, text, logprobs=logprobs)

    def last(self, index: int, logprobs: Logprobs):
        return self.chunk(index, "", self.streams[index].finish_reason, logprobs)

    def chunk_with_usage(self):
        return CompletionResponse(id=self.id, created=self.created, model=self.model,
                                  choices=[], usage=self.usage())

    def answer(self, results: list[tuple[str, Logprobs]]) -> CompletionResponse:
        choices = [self.choice(i, self.echo[i] + text, self.streams[i].finish_reason, logprobs)
                   for i, (text, logprobs) in enumerate(results)]
        return CompletionResponse(id=self.id, created=self.created, model=self.model,
                                  choices=choices, usage=self.usage())


class ChatReply(Reply):
    id_prefix = "chatcmpl"

    def chunk(self, index: int, delta: ChatDelta, finish_reason: str | None = None,
              logprobs: Logprobs = ()) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.id, created=self.created, model=self.model,
                                   choices=[ChatChunkChoice(
                                       index=index, delta=delta, finish_reason=finish_reason,
                                       logprobs=self.chat_logprobs(index, logprobs))])

    def chat_logprobs(self, index: int, logprobs: Logprobs) -> ChatLogprobs | None:
        if self.streams[index].params.logprobs is None:
            return None
        return ChatLogprobs(content=[
            ChatTokenLogprob(**self.top_entry(token, logprob),
                             top_logprobs=[TopLogprob(**self.top_entry(t, lp)) for t, lp in top])
            for token, logprob, top in logprobs])

    def top_entry(self, token: int, logprob: float) -> dict:
        text = self.token_text(token)
        return dict(token=text, logprob=logprob, bytes=list(text.encode()))

    def first(self, index: int):
        return self.chunk(index, ChatDelta(role="assistant", content=""))

    def piece(self, index: int, text: str, logprobs: Logprobs):
        return self.chunk(index, ChatDelta(content=text), logprobs=logprobs)

    def last(self, index: int, logprobs: Logprobs):
        return self.chunk(index, ChatDelta(), self.streams[index].finish_reason, logprobs)

    def chunk_with_usage(self):
        return ChatCompletionChunk(id=self.id, created=self.created, model=self.model,
                                   choices=[], usage=self.usage())

    def answer(self, results: list[tuple[str, Logprobs]]) -> ChatCompletionResponse:
        return ChatCompletionResponse(
            id=self.id, created=self.created, model=self.model, usage=self.usage(),
            choices=[ChatChoice(index=i, message=ChatMessageOut(content=text),
                                finish_reason=self.streams[i].finish_reason,
                                logprobs=self.chat_logprobs(i, logprobs))
                     for i, (text, logprobs) in enumerate(results)])
