"""Text <-> token ids for the frontend: encode, chat template, streaming decode, stop strings.

In Blink (blink.txt §2, "DPU frontend") the frontend, not the GPU, turns an HTTP request into
token ids, writes them into a ring slot, polls the slot for generated ids and streams text back
over SSE. This module is that frontend's text layer. It wraps a Hugging Face `tokenizer.json`
(through the `tokenizers` library, never `transformers`) and adds four things:

1. `Tokenizer.from_folder`: read a model folder the way Hugging Face does (`tokenizer.json`,
   `tokenizer_config.json`, `special_tokens_map.json`, `generation_config.json`,
   `chat_template.jinja`) and resolve BOS / EOS / PAD ids.
2. `Tokenizer.apply_chat_template`: render a conversation with the model's Jinja chat template,
   in the same sandboxed environment `transformers` uses, so the prompt is byte-identical.
3. `IncrementalDetokenizer`: turn a growing list of ids into a stream of text pieces.
4. `StopStringMatcher`: hold back text that might be the start of a stop string.

Why streaming decode needs an algorithm
---------------------------------------
Byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM) works on UTF-8 *bytes*, not characters, so one
character can be split over several tokens. "😀" is the four bytes F0 9F 98 80; a small
vocabulary may store it as two tokens, [F0 9F] and [98 80]. Decoding the first token on its own
gives the replacement character "\\ufffd" (an incomplete character), so the naive loop

    for t in new_ids: send(tokenizer.decode([t]))        # wrong: sends "\\ufffd\\ufffd", not "😀"

is wrong. A CJK character such as "東" (E6 9D B1, three bytes) splits the same way. SentencePiece
tokenizers (Llama 2, Mistral) have a second trap: their decoder strips the leading space of the
*first* token, so decode(["▁world"]) is "world" on its own but " world" after "Hello".

Re-decoding all ids at every step and sending the new suffix is correct but costs O(n) per
token, O(n^2) per request. The fix used by Hugging Face TGI and vLLM keeps two offsets into the
id list (here: a small window of ids and one index into it):

    ids:    ... | prefix (already sent, kept as context) | read (not yet sent) |
    prefix_text = decode(prefix)      full_text = decode(prefix + read)
    if full_text is longer than prefix_text and does not end in "\\ufffd":
        send full_text[len(prefix_text):]; the sent ids become the new prefix

Decoding `prefix` along with the new ids gives the decoder the context it needs (spaces,
byte merges); the "\\ufffd" check waits until a split character is complete. The window holds
only the last emitted ids plus the pending ones, so each step costs O(1) on average.

Putting it together, the frontend's loop for one request looks like this:

    det = tok.detokenizer(prompt_ids)
    stop = StopStringMatcher(["\\n\\nUser:"])
    for token_id in generated_ids:
        text, stopped = stop.feed(det.push(token_id))
        send(text)
        if stopped:
            break
    else:
        send(stop.feed(det.flush())[0] + stop.flush())
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Sequence

import jinja2
import jinja2.ext
import jinja2.nodes
import tokenizers
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = [
    "TokenizerError",
    "Tokenizer",
    "IncrementalDetokenizer",
    "StopStringMatcher",
    "compile_chat_template",
    "render_chat_template",
    "validate_messages",
]

# The named special tokens a chat template can read as variables (`{{ bos_token }}`), in the
# order transformers lists them (`SPECIAL_TOKENS_ATTRIBUTES`).
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
CHAT_ROLES = ("system", "user", "assistant", "tool")
REPLACEMENT_CHAR = "\ufffd"  # what a decoder prints for an incomplete UTF-8 sequence


class TokenizerError(ValueError):
    """A model folder's tokenizer files are missing or malformed, or a chat cannot be rendered."""


# ----------------------------------------------------------------------------------------------
# Reading the folder
# ----------------------------------------------------------------------------------------------


def _read_json(path: Path, required: bool) -> dict[str, Any] | None:
    """Load a JSON object from `path`; None if it is absent and not `required`."""
    if not path.is_file():
        if required:
            raise TokenizerError(f"{path}: file not found")
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise TokenizerError(
            f"{path}: malformed JSON at line {e.lineno}, column {e.colno}: {e.msg}"
        ) from e
    except UnicodeDecodeError as e:
        raise TokenizerError(f"{path}: not UTF-8 text ({e})") from e
    if not isinstance(data, dict):
        raise TokenizerError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _token_content(value: Any, where: str) -> str | None:
    """A special token from a config: a string, {"content": str, ...}, or null."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise TokenizerError(f"{where}: expected a string or {{'content': ...}}, got {value!r}")


def _as_id_list(value: Any, where: str) -> list[int]:
    """generation_config ids are an int, a list of ints, or null."""
    if value is None:
        return []
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise TokenizerError(f"{where}: expected an int or a list of ints, got {value!r}")
    return values


def _pick_chat_template(value: Any, where: str) -> str | None:
    """tokenizer_config's chat_template: a string, or a list of {"name", "template"} (use "default")."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str)
        for t in value
    ):
        named = {t["name"]: t["template"] for t in value}
        if "default" not in named:
            raise TokenizerError(f"{where}: chat_template has no 'default' entry (has {sorted(named)})")
        return named["default"]
    raise TokenizerError(f"{where}: chat_template must be a string or a list of {{name, template}}")


# ----------------------------------------------------------------------------------------------
# Chat templates, rendered the way transformers renders them
# ----------------------------------------------------------------------------------------------


class _GenerationTag(jinja2.ext.Extension):
    """Accept `{% generation %}...{% endgeneration %}` (transformers marks assistant text with it).

    transformers uses the tag to build an assistant-token mask; for rendering it is a no-op.
    """

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # Jinja's own tojson escapes HTML characters (<, >, &); chat templates want plain JSON.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def compile_chat_template(source: str) -> jinja2.Template:
    """Compile a chat template in a sandbox configured like transformers' (untrusted code!)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise TokenizerError(f"chat template has a syntax error on line {e.lineno}: {e.message}") from e


def validate_messages(messages: Any) -> list[dict[str, Any]]:
    """Check an OpenAI-style conversation; return copies with None-valued keys dropped.

    messages: a non-empty list of dicts, each with `role` in CHAT_ROLES and a string `content`.
    An assistant message that carries `tool_calls` may leave `content` out (or None).
    Dropping None values matches transformers: templates test `'key' in message`, not `is none`.
    """
    if not isinstance(messages, (list, tuple)) or len(messages) == 0:
        raise ValueError(f"messages must be a non-empty list of dicts, got {messages!r:.80}")
    cleaned = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f"messages[{i}] must be a dict, got {type(message).__name__}")
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise ValueError(f"messages[{i}]['role'] must be one of {CHAT_ROLES}, got {role!r}")
        content = message.get("content")
        tool_call_only = role == "assistant" and message.get("tool_calls") and content is None
        if not isinstance(content, str) and not tool_call_only:
            raise ValueError(
                f"messages[{i}]['content'] must be a string, got {type(content).__name__}"
            )
        cleaned.append({key: value for key, value in message.items() if value is not None})
    return cleaned


def render_chat_template(
    template: jinja2.Template,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool,
    special_tokens: dict[str, str],
    **template_vars: Any,
) -> str:
    """Render validated `messages` to one prompt string (not tokenized).

    Variables the template sees, as in transformers: messages, add_generation_prompt, tools and
    documents (None unless given), every named special token (bos_token, eos_token, ...), and
    any extra `template_vars` (e.g. enable_thinking=False), which win over the special tokens.
    """
    variables = {"tools": None, "documents": None, **special_tokens, **template_vars}
    try:
        return template.render(messages=messages, add_generation_prompt=add_generation_prompt, **variables)
    except jinja2.exceptions.TemplateError as e:
        # raise_exception(...) inside a template lands here, e.g. "roles must alternate".
        raise TokenizerError(f"chat template rejected the conversation: {e}") from e


# ----------------------------------------------------------------------------------------------
# The tokenizer
# ----------------------------------------------------------------------------------------------


class Tokenizer:
    """A Hugging Face fast tokenizer plus what the serving frontend needs around it.

    Build one with `Tokenizer.from_folder(path)`. Token ids are plain Python ints.
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        special_tokens: dict[str, str] | None = None,
        add_bos_token: bool | None = None,
        chat_template: str | None = None,
        generation_config: dict[str, Any] | None = None,
        name: str = "tokenizer",
    ):
        """
        backend:           the `tokenizers.Tokenizer` loaded from tokenizer.json.
        special_tokens:    {"bos_token": "<s>", "eos_token": "</s>", ...}; strings only.
        add_bos_token:     tokenizer_config's flag (None if absent); a BOS that tokenizer.json's
                           post-processor adds is kept either way.
        chat_template:     Jinja source, or None if the model has none.
        generation_config: generation_config.json's contents (extra eos ids, fallback bos/pad ids).
        name:              used in error messages (the folder path).
        """
        self.backend = backend
        self.special_tokens = dict(special_tokens or {})
        self.chat_template = chat_template
        self.name = name
        gen = generation_config or {}
        self._bos_id = self._special_id("bos_token", gen.get("bos_token_id"))
        self._pad_id = self._special_id("pad_token", gen.get("pad_token_id"))
        eos_first = self._special_id("eos_token", None)
        eos_more = _as_id_list(gen.get("eos_token_id"), f"{name}/generation_config.json: eos_token_id")
        ids = ([eos_first] if eos_first is not None else []) + eos_more
        self._eos_ids = tuple(dict.fromkeys(ids))  # de-duplicated, tokenizer's own EOS first
        if add_bos_token and self._bos_id is None:
            raise TokenizerError(f"{name}: add_bos_token is true but no bos_token is defined")
        # BOS by default when the config asks for it or tokenizer.json's post-processor adds it
        # (Llama's TemplateProcessing). transformers 4.x rebuilt the post-processor from the flag;
        # 5.x ignores the flag once tokenizer.json exists. Honouring both covers old and new folders.
        self.add_bos_token = bool(add_bos_token) or self._post_processor_adds_bos()

    # -- loading -------------------------------------------------------------------------------

    @classmethod
    def from_folder(cls, path: str | os.PathLike) -> Tokenizer:
        """Load tokenizer.json (+ the optional config files) from a Hugging Face model folder.

        Precedence, as in transformers: chat_template.jinja over tokenizer_config's
        chat_template; tokenizer_config's special tokens over special_tokens_map.json's;
        generation_config.json only adds EOS ids (and fills a missing BOS/PAD id).
        """
        folder = Path(path)
        if not folder.is_dir():
            raise TokenizerError(f"{folder}: not a directory (expected a Hugging Face model folder)")
        tokenizer_file = folder / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise TokenizerError(f"{tokenizer_file}: file not found (a model folder needs it)")
        try:
            backend = tokenizers.Tokenizer.from_file(str(tokenizer_file))
        except Exception as e:  # the Rust side raises a bare Exception with a terse message
            _read_json(tokenizer_file, required=True)  # names a JSON syntax error precisely
            raise TokenizerError(f"{tokenizer_file}: not a valid tokenizer.json: {e}") from e

        config = _read_json(folder / "tokenizer_config.json", required=False) or {}
        special_map = _read_json(folder / "special_tokens_map.json", required=False) or {}
        generation = _read_json(folder / "generation_config.json", required=False) or {}

        special_tokens = {}
        for key in SPECIAL_TOKEN_NAMES:
            where = f"{folder}/tokenizer_config.json: {key}"
            token = _token_content(config.get(key), where)
            if token is None:
                token = _token_content(special_map.get(key), f"{folder}/special_tokens_map.json: {key}")
            if token is not None:
                special_tokens[key] = token

        add_bos = config.get("add_bos_token")
        if add_bos is not None and not isinstance(add_bos, bool):
            raise TokenizerError(f"{folder}/tokenizer_config.json: add_bos_token must be true/false")

        template_file = folder / "chat_template.jinja"
        if template_file.is_file():
            chat_template = template_file.read_text(encoding="utf-8")
        else:
            where = f"{folder}/tokenizer_config.json"
            chat_template = _pick_chat_template(config.get("chat_template"), where)

        return cls(backend, special_tokens, add_bos, chat_template, generation, name=str(folder))

    def _special_id(self, key: str, fallback_id: int | None) -> int | None:
        """The id of a named special token; a token named but absent from the vocab is an error."""
        token = self.special_tokens.get(key)
        if token is None:
            return fallback_id
        token_id = self.backend.token_to_id(token)
        if token_id is None and key in ("bos_token", "eos_token"):
            raise TokenizerError(f"{self.name}: {key} {token!r} is not in tokenizer.json's vocabulary")
        return token_id if token_id is not None else fallback_id

    def _post_processor_adds_bos(self) -> bool:
        """Does tokenizer.json's post-processor (e.g. Llama's TemplateProcessing) prepend BOS?"""
        if self._bos_id is None:
            return False
        ids = self.backend.encode("a", add_special_tokens=True).ids
        return ids[:1] == [self._bos_id]

    # -- ids and tokens ------------------------------------------------------------------------

    @property
    def bos_id(self) -> int | None:
        """Beginning-of-sequence id, or None (e.g. Qwen has no BOS)."""
        return self._bos_id

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """Every id that ends generation: tokenizer_config's eos_token, then generation_config's."""
        return self._eos_ids

    @property
    def pad_id(self) -> int | None:
        """Padding id, or None."""
        return self._pad_id

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer knows, added tokens included.

        The model's embedding table may have more rows (padded to a multiple of 64 or 128).
        """
        return self.backend.get_vocab_size(with_added_tokens=True)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary string of an id (byte-level tokens look like 'Ġworld'), or None."""
        return self.backend.id_to_token(int(token_id))

    def token_to_id(self, token: str) -> int | None:
        """The id of a vocabulary string, or None."""
        return self.backend.token_to_id(token)

    # -- encode / decode -----------------------------------------------------------------------

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """text -> ids, list[int] of length n_tokens.

        add_bos: None = the folder's default (`self.add_bos_token`); True / False force it.
        BOS is never doubled: a chat template that already writes `{{ bos_token }}` at the
        start produces text whose first id is BOS, and then none is added.
        Special-token strings in `text` (e.g. "<|im_start|>") become their single ids.
        """
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        ids = self.backend.encode(text, add_special_tokens=False).ids
        want_bos = self.add_bos_token if add_bos is None else add_bos
        if want_bos:
            if self._bos_id is None:
                raise TokenizerError(f"{self.name}: add_bos=True but the tokenizer has no BOS token")
            if ids[:1] != [self._bos_id]:
                ids.insert(0, self._bos_id)
        return ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """ids (any iterable of ints, e.g. a NumPy row) -> text."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def detokenizer(
        self, prompt_ids: Sequence[int] | None = None, skip_special_tokens: bool = True
    ) -> IncrementalDetokenizer:
        """A fresh streaming decoder for one request's generated ids (see IncrementalDetokenizer)."""
        return IncrementalDetokenizer(self, prompt_ids, skip_special_tokens)

    # -- chat ----------------------------------------------------------------------------------

    @cached_property
    def _compiled_chat_template(self) -> jinja2.Template:
        if self.chat_template is None:
            raise TokenizerError(
                f"{self.name}: this tokenizer has no chat template (no chat_template in "
                "tokenizer_config.json and no chat_template.jinja); send plain text instead"
            )
        return compile_chat_template(self.chat_template)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **template_vars: Any
    ) -> str:
        """Render a conversation to the prompt string the model was trained on.

        messages: [{"role": "system"|"user"|"assistant"|"tool", "content": str}, ...], non-empty.
        add_generation_prompt: end with the header that opens the assistant's turn.
        template_vars: extra template variables (tools=[...], enable_thinking=False, ...).
        Returns a str; `encode(prompt)` then gives the ids (without doubling BOS).
        """
        cleaned = validate_messages(messages)
        template = self._compiled_chat_template
        return render_chat_template(
            template, cleaned, add_generation_prompt, self.special_tokens, **template_vars
        )


# ----------------------------------------------------------------------------------------------
# Streaming
# ----------------------------------------------------------------------------------------------


def stop_ids(folder, tokenizer: Tokenizer | None = None) -> tuple[int, ...]:
    """The ids that end a request unless it sets ``ignore_eos``: the model config's EOS ids
    (``config.json``) and the tokenizer's, together, de-duplicated. ``tokenizer``: the folder's,
    if already loaded."""
    from ..config import ModelConfig

    tokenizer = tokenizer or Tokenizer.from_folder(folder)
    return tuple(dict.fromkeys(ModelConfig.from_folder(folder).eos_token_ids + tokenizer.eos_ids))


class IncrementalDetokenizer:
    """Streams text from token ids pushed one at a time (prefix/read-offset algorithm, see top).

    State: `_window` = the ids from the prefix offset on; `_read` = where, inside the window,
    the not-yet-sent ids start. So window[:_read] is context already sent, window[_read:] pending.

    Invariant for valid text: "".join(pushes) + flush() == tokenizer.decode(generated ids),
    except that with `prompt_ids` the first piece carries the space that joins it to the prompt.
    """

    CONTEXT_TOKENS = 6  # prompt ids kept as context for the first generated token
    MAX_PENDING = 32  # a valid character never needs this many ids; bounds the work per push

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_ids: Sequence[int] | None = None,
        skip_special_tokens: bool = True,
    ):
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        context = [int(t) for t in (prompt_ids or [])][-self.CONTEXT_TOKENS :]
        self._window: list[int] = context
        self._read = len(context)
        self._pieces: list[str] = []

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special)

    def push(self, token_id: int) -> str:
        """Add one generated id; return the text it completes ("" if it is held back)."""
        self._window.append(int(token_id))
        return self._advance(force=len(self._window) - self._read >= self.MAX_PENDING)

    def flush(self) -> str:
        """End of stream: return whatever is still held back, even an incomplete character."""
        return self._advance(force=True)

    @property
    def text(self) -> str:
        """All text emitted so far (pushes and flushes), without the prompt."""
        return "".join(self._pieces)

    def _advance(self, force: bool) -> str:
        prefix_text = self._decode(self._window[: self._read])
        full_text = self._decode(self._window)
        ready = len(full_text) > len(prefix_text) and not full_text.endswith(REPLACEMENT_CHAR)
        if not (ready or force):
            return ""  # a split character or a skipped special token: wait for more ids
        new_text = full_text[len(prefix_text) :]
        # The ids just sent become the next prefix; older ids are no longer needed.
        self._window = self._window[self._read :]
        self._read = len(self._window)
        self._pieces.append(new_text)
        return new_text


class StopStringMatcher:
    """Cut a text stream at the first stop string, holding back what might begin one.

    feed("Hello wo") with stop "world" returns ("Hello ", False) and holds "wo"; feed("rld!")
    then returns ("", True): the stop string and everything after it are never returned.
    The result does not depend on how the stream is chunked: the stop that *completes* first
    wins (on a tie, the one that starts first).
    """

    def __init__(self, stop: Sequence[str]):
        if isinstance(stop, str):
            stop = [stop]
        if not all(isinstance(s, str) and s for s in stop):
            raise ValueError(f"stop strings must be non-empty strings, got {stop!r}")
        self.stop = tuple(stop)
        self.matched: str | None = None  # which stop string ended the stream
        self._held = ""

    @property
    def stopped(self) -> bool:
        return self.matched is not None

    def feed(self, text: str) -> tuple[str, bool]:
        """Add new text; return (text safe to send now, whether a stop string has appeared)."""
        if self.stopped:
            return "", True
        buffer = self._held + text
        hit = self._first_complete_stop(buffer)
        if hit is not None:
            start, stop = hit
            self.matched, self._held = stop, ""
            return buffer[:start], True
        keep = self._longest_stop_prefix_suffix(buffer)
        self._held = buffer[len(buffer) - keep :]
        return buffer[: len(buffer) - keep], False

    def flush(self) -> str:
        """End of stream without a stop: release the held-back text."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _first_complete_stop(self, buffer: str) -> tuple[int, str] | None:
        """(start, stop) of the stop occurrence that ends earliest in buffer, or None."""
        best = None
        for stop in self.stop:
            start = buffer.find(stop)  # the first occurrence of a stop also ends first
            if start >= 0:
                key = (start + len(stop), start)
                if best is None or key < best[0]:
                    best = (key, stop)
        return None if best is None else (best[0][1], best[1])

    def _longest_stop_prefix_suffix(self, buffer: str) -> int:
        """Length of the longest end of `buffer` that is a proper prefix of some stop string."""
        longest = 0
        for stop in self.stop:
            for k in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:k]):
                    longest = k
                    break
        return longest
