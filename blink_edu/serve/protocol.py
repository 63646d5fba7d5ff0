"""The OpenAI wire format, as Pydantic models: what a client may send and what we send back.

Blink §3 ("HTTP parsing/validation" is the DPU frontend's first job) and docs/design.md §2. Requests
are validated in *strict* JSON mode, so ``"max_tokens": "16"`` is an error rather than a silent
conversion: a frontend that guesses what a client meant hides the client's bug. Unknown fields
are ignored, as OpenAI does. Parameters we know and cannot honour (``tools``, ``tool_choice``,
``functions``, ``function_call``, ``response_format`` other than text, ``suffix``,
``best_of`` other than ``n``) are rejected by name (``UNSUPPORTED``) instead of being ignored.

Supported as vLLM's OpenAI server does: ``n`` choices per prompt (index ``prompt * n + i``),
a list of prompts in one completions request, ``echo`` (the prompt's text before the
completion's), ``logprobs`` (completions: an int, the top alternatives per token; chat:
``logprobs: true`` with ``top_logprobs``), ``presence_penalty``, ``frequency_penalty`` and
``logit_bias`` (token id as a string -> bias in [-100, 100]).

Extensions beyond OpenAI's schema, as vLLM spells them: ``top_k`` (0 or -1 = off) and
``ignore_eos`` (keep generating past the end-of-sequence token, for benchmarks).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# Request fields we know but do not implement: a request that sets one gets a 400 naming it.
UNSUPPORTED = ("tools", "tool_choice", "functions", "function_call", "suffix")

# --- requests ------------------------------------------------------------------------------------


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True)
    include_usage: bool = False  # one last chunk, before [DONE], that carries `usage`


class SamplingFields(BaseModel):
    """The fields both endpoints share. Ranges follow OpenAI's API reference."""

    model_config = ConfigDict(strict=True)

    model: str | None = None  # None: the one model this server runs
    temperature: float = Field(1.0, ge=0, le=2)  # 0 = greedy
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=-1)  # extension; 0 or -1 = off
    seed: int | None = Field(None, ge=0, lt=2**63)
    n: int = Field(1, ge=1)  # choices per prompt
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False  # extension
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None  # token id (as a string) -> bias
    # known, not implemented: refused by name when set (UNSUPPORTED, response_format)
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    response_format: dict[str, Any] | None = None

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class CompletionRequest(SamplingFields):
    """POST /v1/completions. ``prompt``: text, or token ids, or a list of one text."""

    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = 16  # OpenAI's default for completions
    echo: bool = False  # the prompt's text before each choice's completion
    logprobs: int | None = Field(None, ge=0, le=20)  # top alternatives per token
    suffix: str | None = None  # not implemented: refused when set
    best_of: int | None = None  # only best_of == n (or unset) is served

    def num_logprobs(self) -> int | None:
        return self.logprobs


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True)
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True)
    role: str  # the tokenizer's chat template checks it (system | user | assistant | tool)
    content: str | list[TextPart] | None = None
    name: str | None = None

    def as_template_dict(self) -> dict:
        """The message as a chat template reads it: content parts joined into one string."""
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        return {"role": self.role, "content": content, "name": self.name}


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions. Without a max: as many tokens as the context leaves."""

    messages: list[ChatMessage]
    max_tokens: int | None = None  # deprecated by OpenAI in favour of max_completion_tokens
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)  # needs logprobs: true

    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


# --- responses -----------------------------------------------------------------------------------


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(BaseModel):
    """OpenAI's legacy completions shape: parallel lists, one entry per token."""

    tokens: list[str] = []
    token_logprobs: list[float] = []
    top_logprobs: list[dict[str, float]] = []
    text_offset: list[int] = []


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str | None = None  # "stop" | "length"; None in a chunk that is not the last
    logprobs: CompletionLogprobs | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob]


class CompletionResponse(BaseModel):
    """Both the whole answer (``object="text_completion"``) and each streamed chunk: OpenAI uses
    the same shape and the same ``object`` for the two."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatMessageOut
    finish_reason: str
    logprobs: ChatLogprobs | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None  # only in the first chunk
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    finish_reason: str | None = None
    logprobs: ChatLogprobs | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "blink_edu"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""

    error: ErrorBody
