"""Tests for blink_edu.model.tokenizer.

Every tokenizer here is trained in the test from a few lines of text, so nothing is downloaded:
- a byte-level BPE (GPT-2 / Llama 3 / SmolLM style) with a tiny vocabulary, so CJK characters and
  emoji are split over several tokens;
- a SentencePiece-style BPE (Llama 2 / Mistral style: "▁" for spaces, <0xXX> byte-fallback
  tokens, a decoder that strips the first space).
transformers (a dev dependency) is the oracle for the chat template and for BOS handling.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFBackend
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from blink_edu.model.tokenizer import (
    IncrementalDetokenizer,
    StopStringMatcher,
    Tokenizer,
    TokenizerError,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the oracle must never try the network

CORPUS = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "The café serves crème brûlée. Ångström and the naïve façade.",
    "東京は日本の首都です。中文测试，你好世界。",
    "Emoji: 😀 🎉 🚀 👍🏽 and more text about serving large language models.",
] * 10

TEXTS = [
    "Hello world!",
    "The café serves crème brûlée.",
    "東京は日本の首都です。",
    "Emoji: 😀 🎉 🚀 👍🏽 done",
    "mixed 你好 naïve 😀 ok",
    "  leading spaces and\ttabs\nnewlines  ",
    "",
]

CHATML = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant.<|im_end|>\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Llama 2's template, laid out over lines so trim_blocks / lstrip_blocks matter.
LLAMA2 = """\
{% if messages[0]['role'] == 'system' %}
    {% set loop_messages = messages[1:] %}
    {% set system_message = messages[0]['content'] %}
{% else %}
    {% set loop_messages = messages %}
    {% set system_message = false %}
{% endif %}
{% for message in loop_messages %}
    {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {% endif %}
    {% if loop.index0 == 0 and system_message != false %}
        {% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}
    {% else %}
        {% set content = message['content'] %}
    {% endif %}
    {% if message['role'] == 'user' %}
        {{- bos_token + '[INST] ' + content.strip() + ' [/INST]' -}}
    {% elif message['role'] == 'assistant' %}
        {{- ' ' + content.strip() + ' ' + eos_token -}}
    {% endif %}
{% endfor %}
"""

# Llama 3.1 / Qwen-like: namespace, break, tojson (with HTML characters), strftime_now, tools,
# tool calls, a template variable (enable_thinking), and {% generation %}.
TOOLS_TEMPLATE = """\
{{- bos_token }}
{%- set ns = namespace(found_system=false) %}
{%- for m in messages %}
    {%- if m['role'] == 'system' %}{% set ns.found_system = true %}{% break %}{% endif %}
{%- endfor %}
{%- if not ns.found_system %}
<|im_start|>system
Today Date: {{ strftime_now("%d %b %Y") }}
{%- if tools %} Tools: {{ tools | tojson(indent=2) }}{% endif %}
<|im_end|>
{% endif %}
{%- for message in messages %}
    {%- if message.role == 'tool' %}
<|im_start|>tool
{{ {"output": message.content, "note": "<b>&</b> é"} | tojson }}<|im_end|>
    {%- elif message.tool_calls is defined %}
<|im_start|>assistant
{% for call in message.tool_calls %}{{ call | tojson }}{% endfor %}<|im_end|>
    {%- elif message.role == 'assistant' %}
<|im_start|>assistant
{% generation %}{{ message.content }}{% endgeneration %}<|im_end|>
    {%- else %}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}
{%- endif %}
"""

CONVERSATIONS = [
    [{"role": "user", "content": "Hi there"}],
    [
        {"role": "system", "content": "Be brief. Réponds en français."},
        {"role": "user", "content": "東京はどこ? 😀"},
    ],
    [
        {"role": "user", "content": "  What is 2+2?  "},
        {"role": "assistant", "content": "4", "name": None},
        {"role": "user", "content": "And 3+3? <|im_end|> is just text here"},
    ],
]

TOOL_CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}],
    },
    {"role": "tool", "content": "22°C"},
]

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "Current weather <in °C>",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


# ----------------------------------------------------------------------------------------------
# Building tokenizers and model folders
# ----------------------------------------------------------------------------------------------


def train_byte_level() -> HFBackend:
    """A byte-level BPE with only ~60 merges: multi-byte characters stay split."""
    tok = HFBackend(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def train_sentencepiece_like(bos_post_processor: bool) -> HFBackend:
    """Llama-2-style BPE: '▁' spaces, <0xXX> byte fallback for unseen characters (CJK, emoji)."""
    tok = HFBackend(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    specials = ["<unk>", "<s>", "</s>"]
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=specials, show_progress=False)
    tok.train_from_iterator([line for line in CORPUS if "東" not in line and "😀" not in line], trainer)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    spec["model"]["byte_fallback"] = True
    tok = HFBackend.from_str(json.dumps(spec))
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    if bos_post_processor:
        bos = tok.token_to_id("<s>")
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
        )
    return tok


def save_folder(path: Path, backend: HFBackend, config: dict | None = None, **files) -> Path:
    """Write an HF model folder: tokenizer.json, tokenizer_config.json, and other files by name."""
    path.mkdir(parents=True, exist_ok=True)
    backend.save(str(path / "tokenizer.json"))
    if config is not None:
        (path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    for name, content in files.items():
        name = name.replace("__", ".")  # chat_template__jinja -> chat_template.jinja
        text = content if isinstance(content, str) else json.dumps(content)
        (path / name).write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def byte_level_backend():
    return train_byte_level()


@pytest.fixture(scope="module")
def byte_folder(tmp_path_factory, byte_level_backend):
    """SmolLM2-like folder: ChatML, BOS = <|im_start|>, no add_bos_token, eos listed twice."""
    config = {
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|im_end|>",
        "unk_token": "<|endoftext|>",
        "chat_template": CHATML,
    }
    generation = {"bos_token_id": 1, "eos_token_id": [2, 0]}
    return save_folder(
        tmp_path_factory.mktemp("byte"), byte_level_backend, config, generation_config__json=generation
    )


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    """Llama-2-like folder: dict-valued tokens, template list, special_tokens_map.json, int eos."""
    config = {
        "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": False, "special": True},
        "eos_token": {"__type": "AddedToken", "content": "</s>", "lstrip": False, "special": True},
        "add_bos_token": True,
        "chat_template": [
            {"name": "default", "template": LLAMA2},
            {"name": "tool_use", "template": TOOLS_TEMPLATE},
        ],
    }
    special_map = {"unk_token": {"content": "<unk>", "special": True}, "bos_token": "<s>"}
    return save_folder(
        tmp_path_factory.mktemp("llama"),
        train_sentencepiece_like(bos_post_processor=True),
        config,
        special_tokens_map__json=special_map,
        generation_config__json={"eos_token_id": 2},
    )


@pytest.fixture(scope="module")
def tools_folder(tmp_path_factory, byte_level_backend):
    """chat_template.jinja beside a config template: the file wins (as in transformers)."""
    config = {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "chat_template": CHATML}
    return save_folder(
        tmp_path_factory.mktemp("tools"), byte_level_backend, config, chat_template__jinja=TOOLS_TEMPLATE
    )


@pytest.fixture(scope="module")
def byte_tok(byte_folder):
    return Tokenizer.from_folder(byte_folder)


@pytest.fixture(scope="module")
def llama_tok(llama_folder):
    return Tokenizer.from_folder(llama_folder)


def hf_oracle(folder: Path):
    transformers = pytest.importorskip("transformers")
    return transformers.PreTrainedTokenizerFast.from_pretrained(str(folder))


def stream(det: IncrementalDetokenizer, ids) -> tuple[list[str], str]:
    """Push ids one at a time; return the pieces and the final flush."""
    pieces = [det.push(i) for i in ids]
    return pieces, det.flush()


# ----------------------------------------------------------------------------------------------
# Loading, ids, encode / decode
# ----------------------------------------------------------------------------------------------


def test_package_imports_neither_torch_nor_transformers():
    code = (
        "import sys, blink_edu.model.tokenizer; "
        "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])


def test_byte_level_vocab_splits_characters_over_tokens(byte_tok):
    # A token that decodes to U+FFFD on its own holds part of a character's UTF-8 bytes.
    for text in ["東京", "😀", "你好"]:
        ids = byte_tok.encode(text)
        assert len(ids) > len(text)
        assert any("\ufffd" in byte_tok.decode([i]) for i in ids), text


def test_sentencepiece_like_uses_byte_fallback(llama_tok):
    ids = llama_tok.encode("東京 😀", add_bos=False)
    pieces = [llama_tok.id_to_token(i) for i in ids]
    assert "<0xE6>" in pieces and "<0xF0>" in pieces, pieces


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_round_trip(byte_tok, llama_tok, text):
    assert byte_tok.decode(byte_tok.encode(text)) == text
    # SentencePiece-style decoders drop one leading space ("▁" marks the start of a word).
    expected = text[1:] if text.startswith(" ") else text
    assert llama_tok.decode(llama_tok.encode(text)) == expected


@pytest.mark.parametrize("text", TEXTS)
def test_encode_matches_transformers(byte_folder, llama_folder, byte_tok, llama_tok, text):
    assert byte_tok.encode(text) == hf_oracle(byte_folder).encode(text)
    assert llama_tok.encode(text) == hf_oracle(llama_folder).encode(text)


def test_special_ids_and_vocab(byte_folder, byte_tok, llama_folder, llama_tok):
    hf = hf_oracle(byte_folder)
    assert byte_tok.bos_id == hf.bos_token_id == byte_tok.token_to_id("<|im_start|>")
    assert byte_tok.pad_id == hf.pad_token_id
    assert byte_tok.eos_ids == (2, 0)  # tokenizer_config's <|im_end|>, then generation_config's
    assert byte_tok.vocab_size == len(hf) == 320
    assert [byte_tok.id_to_token(i) for i in range(5)] == hf.convert_ids_to_tokens(list(range(5)))
    assert byte_tok.id_to_token(10_000) is None

    # Dict-valued tokens; unk_token only in special_tokens_map.json; eos_token_id as an int.
    assert llama_tok.special_tokens["bos_token"] == "<s>"
    assert llama_tok.special_tokens["unk_token"] == "<unk>"
    assert llama_tok.bos_id == 1 and llama_tok.eos_ids == (2,) and llama_tok.pad_id is None
    assert llama_tok.vocab_size == len(hf_oracle(llama_folder)) > 256  # BPE pieces + 256 byte tokens


def test_bos_is_never_doubled(llama_tok, byte_tok):
    bos = llama_tok.bos_id
    assert llama_tok.encode("Hi")[0] == bos
    assert llama_tok.encode("<s>Hi").count(bos) == 1
    assert llama_tok.encode("Hi", add_bos=False)[0] != bos
    # A chat template that writes {{ bos_token }} itself: still exactly one BOS.
    prompt = llama_tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert prompt.startswith("<s>[INST]")
    assert llama_tok.encode(prompt).count(bos) == 1

    # SmolLM-like: no BOS by default; asking for one adds it once.
    assert byte_tok.encode("Hi")[0] != byte_tok.bos_id
    assert byte_tok.encode("Hi", add_bos=True).count(byte_tok.bos_id) == 1
    assert byte_tok.encode("<|im_start|>Hi", add_bos=True).count(byte_tok.bos_id) == 1


@pytest.mark.parametrize("post_processor_adds_bos", [True, False])
@pytest.mark.parametrize("add_bos_token", ["absent", True, False])
def test_default_bos_follows_config_then_post_processor(tmp_path, post_processor_adds_bos, add_bos_token):
    config = {"bos_token": "<s>", "eos_token": "</s>"}
    if add_bos_token != "absent":
        config["add_bos_token"] = add_bos_token
    folder = save_folder(tmp_path, train_sentencepiece_like(post_processor_adds_bos), config)
    tok, hf = Tokenizer.from_folder(folder), hf_oracle(folder)
    # BOS when the config asks for it or tokenizer.json's post-processor adds it.
    expected = post_processor_adds_bos or add_bos_token is True
    assert tok.add_bos_token is expected
    for text in ["Hello world", "café 😀"]:
        ids = tok.encode(text)
        assert (ids[0] == tok.bos_id) is expected and ids.count(tok.bos_id) == int(expected)
        if post_processor_adds_bos or add_bos_token is not True:
            assert ids == hf.encode(text)
        else:
            # transformers 5 ignores add_bos_token once tokenizer.json exists (4.x honoured it).
            assert ids == [tok.bos_id] + hf.encode(text)


# ----------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------


def test_missing_folder_and_missing_tokenizer_json(tmp_path):
    with pytest.raises(TokenizerError, match="not a directory"):
        Tokenizer.from_folder(tmp_path / "nope")
    with pytest.raises(TokenizerError, match=r"tokenizer\.json: file not found"):
        Tokenizer.from_folder(tmp_path)


def test_malformed_tokenizer_json(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "model": ', encoding="utf-8")
    with pytest.raises(TokenizerError, match=r"tokenizer\.json: malformed JSON at line 1"):
        Tokenizer.from_folder(tmp_path)


def test_json_that_is_not_a_tokenizer(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"hello": 1}', encoding="utf-8")
    with pytest.raises(TokenizerError, match=r"tokenizer\.json: not a valid tokenizer\.json"):
        Tokenizer.from_folder(tmp_path)


def test_malformed_config_files(tmp_path, byte_level_backend):
    folder = save_folder(tmp_path, byte_level_backend)
    (folder / "tokenizer_config.json").write_text("{'single': 'quotes'}", encoding="utf-8")
    with pytest.raises(TokenizerError, match=r"tokenizer_config\.json: malformed JSON"):
        Tokenizer.from_folder(folder)
    (folder / "tokenizer_config.json").write_text('["a list"]', encoding="utf-8")
    with pytest.raises(TokenizerError, match=r"tokenizer_config\.json: expected a JSON object"):
        Tokenizer.from_folder(folder)
    (folder / "tokenizer_config.json").write_text('{"eos_token": 7}', encoding="utf-8")
    with pytest.raises(TokenizerError, match="eos_token: expected a string"):
        Tokenizer.from_folder(folder)
    (folder / "tokenizer_config.json").write_text('{"eos_token": "<nope>"}', encoding="utf-8")
    with pytest.raises(TokenizerError, match="eos_token '<nope>' is not in tokenizer.json's vocab"):
        Tokenizer.from_folder(folder)
    (folder / "tokenizer_config.json").write_text("{}", encoding="utf-8")
    (folder / "generation_config.json").write_text('{"eos_token_id": "2"}', encoding="utf-8")
    with pytest.raises(TokenizerError, match=r"generation_config\.json: eos_token_id"):
        Tokenizer.from_folder(folder)


def test_missing_chat_template_says_so(tmp_path, byte_level_backend):
    tok = Tokenizer.from_folder(save_folder(tmp_path, byte_level_backend, {"eos_token": "<|im_end|>"}))
    with pytest.raises(TokenizerError, match="has no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


def test_template_list_without_default_and_syntax_error(tmp_path, byte_level_backend):
    config = {"chat_template": [{"name": "tool_use", "template": "x"}]}
    folder = save_folder(tmp_path, byte_level_backend, config)
    with pytest.raises(TokenizerError, match=r"no 'default' entry \(has \['tool_use'\]\)"):
        Tokenizer.from_folder(folder)
    config = {"chat_template": "{% for m in messages %}{{ m.content }}"}
    tok = Tokenizer.from_folder(save_folder(tmp_path, byte_level_backend, config))
    with pytest.raises(TokenizerError, match="chat template has a syntax error on line 1"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


@pytest.mark.parametrize(
    "messages, problem",
    [
        ([], "non-empty list"),
        ("hello", "non-empty list"),
        ([["user", "hi"]], r"messages\[0\] must be a dict"),
        ([{"role": "bot", "content": "hi"}], r"messages\[0\]\['role'\] must be one of"),
        ([{"content": "hi"}], r"\['role'\] must be one of .* got None"),
        ([{"role": "user", "content": "a"}, {"role": "user"}], r"messages\[1\]\['content'\] must be a str"),
        ([{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "must be a string, got list"),
    ],
)
def test_bad_messages_are_named(byte_tok, messages, problem):
    with pytest.raises(ValueError, match=problem):
        byte_tok.apply_chat_template(messages)


def test_template_raise_exception_becomes_a_clear_error(llama_tok):
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(TokenizerError, match="rejected the conversation: Conversation roles must alternate"):
        llama_tok.apply_chat_template(bad)


# ----------------------------------------------------------------------------------------------
# Chat templates against transformers
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("folder_name", ["byte_folder", "llama_folder", "tools_folder"])
def test_chat_template_matches_transformers(request, folder_name, conversation, add_generation_prompt):
    folder = request.getfixturevalue(folder_name)
    ours = Tokenizer.from_folder(folder).apply_chat_template(conversation, add_generation_prompt)
    theirs = hf_oracle(folder).apply_chat_template(
        conversation, add_generation_prompt=add_generation_prompt, tokenize=False
    )
    assert ours == theirs


def test_chat_template_with_tools_and_variables_matches_transformers(tools_folder):
    ours_tok, hf = Tokenizer.from_folder(tools_folder), hf_oracle(tools_folder)
    for variables in [{}, {"enable_thinking": False}]:
        ours = ours_tok.apply_chat_template(TOOL_CONVERSATION, tools=[WEATHER_TOOL], **variables)
        theirs = hf.apply_chat_template(
            TOOL_CONVERSATION, tools=[WEATHER_TOOL], add_generation_prompt=True, tokenize=False, **variables
        )
        assert ours == theirs
    assert '"note": "<b>&</b> é"' in ours  # tojson: no HTML escaping, no ASCII escaping
    assert "Today Date:" in ours and ours.endswith("<|im_start|>assistant\n<think></think>")


def test_chat_template_file_wins_over_config(tools_folder):
    tok = Tokenizer.from_folder(tools_folder)
    assert tok.chat_template == (tools_folder / "chat_template.jinja").read_text(encoding="utf-8")
    assert tok.apply_chat_template(CONVERSATIONS[0]).startswith("<|endoftext|>")


# ----------------------------------------------------------------------------------------------
# Streaming detokenization
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", TEXTS + ["😀😀😀", "👍🏽東京👍🏽"])
@pytest.mark.parametrize("which", ["byte_tok", "llama_tok"])
def test_streaming_equals_full_decode(request, which, text):
    tok = request.getfixturevalue(which)
    ids = tok.encode(text, add_bos=False)
    det = tok.detokenizer()
    pieces, tail = stream(det, ids)
    assert "".join(pieces) + tail == tok.decode(ids) == det.text
    assert tok.decode(ids) == text or (which == "llama_tok" and text.startswith(" "))
    assert not any("\ufffd" in p for p in pieces)  # never a half character on the wire
    assert tail == ""  # valid text never needs the flush


def test_streaming_holds_back_a_split_character(byte_tok):
    ids = byte_tok.encode("😀")
    assert len(ids) >= 2
    pieces, tail = stream(byte_tok.detokenizer(), ids)
    assert pieces[:-1] == [""] * (len(ids) - 1) and pieces[-1] == "😀" and tail == ""


def test_flush_releases_an_incomplete_character(byte_tok):
    ids = byte_tok.encode("a😀")[:-1]  # cut inside the emoji
    det = byte_tok.detokenizer()
    pieces, tail = stream(det, ids)
    assert "".join(pieces) == "a" and tail.endswith("\ufffd")
    assert det.text == byte_tok.decode(ids)


def test_prompt_context_keeps_the_joining_space(llama_tok):
    prompt = llama_tok.encode("Hello")
    full = llama_tok.encode("Hello world")
    assert full[: len(prompt)] == prompt
    generated = full[len(prompt) :]
    with_context = stream(llama_tok.detokenizer(prompt_ids=prompt), generated)
    without = stream(llama_tok.detokenizer(), generated)
    assert "".join(with_context[0]) == " world"
    assert "".join(without[0]) == "world" == llama_tok.decode(generated)


def test_special_tokens_are_skipped_or_kept(byte_tok):
    ids = byte_tok.encode("Hi<|im_end|>")
    assert byte_tok.token_to_id("<|im_end|>") in ids
    assert "".join(stream(byte_tok.detokenizer(), ids)[0]) == "Hi"
    kept = byte_tok.detokenizer(skip_special_tokens=False)
    assert "".join(stream(kept, ids)[0]) == "Hi<|im_end|>"


def test_work_per_token_stays_bounded(byte_tok):
    # The window of ids decoded per push must not grow with the length of the stream.
    ids = byte_tok.encode(" ".join(TEXTS) * 40)
    det = byte_tok.detokenizer()
    widest = 0
    for i in ids:
        det.push(i)
        widest = max(widest, len(det._window))
    assert len(ids) > 1000 and widest <= 12
    # Many skipped special tokens in a row: the window is capped too, and the text is right.
    eos = byte_tok.token_to_id("<|im_end|>")
    det = byte_tok.detokenizer()
    pieces, tail = stream(det, [eos] * 100 + byte_tok.encode(" ok"))
    assert len(det._window) <= IncrementalDetokenizer.MAX_PENDING
    assert "".join(pieces) + tail == " ok"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=40))
def test_streaming_any_unicode_text(byte_tok, llama_tok, text):
    ids = byte_tok.encode(text)
    pieces, tail = stream(byte_tok.detokenizer(), ids)
    assert "".join(pieces) + tail == text
    ids = llama_tok.encode(text, add_bos=False)
    pieces, tail = stream(llama_tok.detokenizer(), ids)
    assert "".join(pieces) + tail == llama_tok.decode(ids)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_streaming_any_byte_level_ids(byte_tok, data):
    # Arbitrary ids (invalid UTF-8, special tokens) still stream to exactly the full decode.
    ids = data.draw(st.lists(st.integers(0, byte_tok.vocab_size - 1), max_size=30))
    prompt = data.draw(st.lists(st.integers(3, byte_tok.vocab_size - 1), max_size=8))
    pieces, tail = stream(byte_tok.detokenizer(), ids)
    assert "".join(pieces) + tail == byte_tok.decode(ids)
    # With a prompt, byte-level text simply continues it (no space rules).
    if "\ufffd" not in byte_tok.decode(prompt) and "\ufffd" not in byte_tok.decode(prompt + ids):
        pieces, tail = stream(byte_tok.detokenizer(prompt_ids=prompt), ids)
        assert "".join(pieces) + tail == byte_tok.decode(ids)


# ----------------------------------------------------------------------------------------------
# Stop strings
# ----------------------------------------------------------------------------------------------


def test_stop_string_is_held_back_then_cut():
    m = StopStringMatcher(["world"])
    assert m.feed("Hello wo") == ("Hello ", False)
    assert m.feed("rld! more") == ("", True)
    assert m.matched == "world" and m.stopped
    assert m.feed("anything") == ("", True) and m.flush() == ""


def test_partial_stop_that_fails_is_released():
    m = StopStringMatcher(["STOP"])
    assert m.feed("a ST") == ("a ", False)
    assert m.feed("Ox") == ("STOx", False)
    assert m.feed("ST") == ("", False)
    assert m.flush() == "ST" and not m.stopped


def test_stop_string_across_token_boundaries(byte_tok):
    # The stop string "😀 c" starts inside a split emoji: nothing of it may leak out.
    text, stop = "Emoji: 🎉 and 😀 café after", "😀 c"
    ids = byte_tok.encode(text)
    det, m = byte_tok.detokenizer(), StopStringMatcher([stop, "never"])
    sent = ""
    for i in ids:
        out, stopped = m.feed(det.push(i))
        sent += out
        assert "😀" not in sent and "\ufffd" not in sent
        if stopped:
            break
    assert stopped and m.matched == stop
    assert sent == "Emoji: 🎉 and "


def test_no_stop_in_stream_returns_everything(byte_tok):
    text = "mixed 你好 naïve 😀 ok"
    det, m = byte_tok.detokenizer(), StopStringMatcher(["ok!", "你好吗"])
    sent = "".join(m.feed(det.push(i))[0] for i in byte_tok.encode(text))
    sent += m.feed(det.flush())[0] + m.flush()
    assert sent == text and not m.stopped


def test_stop_strings_must_be_non_empty():
    with pytest.raises(ValueError, match="non-empty strings"):
        StopStringMatcher(["ok", ""])
    assert StopStringMatcher("one").stop == ("one",)


def first_stop_reference(text: str, stops: list[str]) -> tuple[str, bool]:
    """The text before the stop occurrence that ends first (ties: the one starting first)."""
    ends = [(i + len(s), i) for s in stops for i in range(len(text)) if text.startswith(s, i)]
    if not ends:
        return text, False
    _, start = min(ends)
    return text[:start], True


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="ab", max_size=20),
    stops=st.lists(st.text(alphabet="ab", min_size=1, max_size=4), min_size=1, max_size=3),
    cuts=st.lists(st.integers(0, 20), max_size=6),
)
def test_stop_matching_does_not_depend_on_chunking(text, stops, cuts):
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    chunks = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    m, sent, stopped = StopStringMatcher(stops), "", False
    for chunk in chunks:
        out, stopped = m.feed(chunk)
        sent += out
        if stopped:
            break
    if not stopped:
        sent += m.flush()
    assert (sent, stopped) == first_stop_reference(text, stops)
