"""The parameters the server honours beyond a plain completion, through the official ``openai``
client: ``logit_bias``, ``presence_penalty`` and ``frequency_penalty`` (the tokens equal the
NumPy reference's under the same adjustments), ``n`` choices, a list of prompts, ``echo``,
``logprobs`` / ``top_logprobs`` (completions and chat), and ``GET /v1/models/{id}``. For each,
the streamed answer equals the whole one."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import openai
import pytest
from server_process import CHAT, LONG, MODEL, PROMPT

from blink_edu.config import SamplingParams
from blink_edu.model import reference
from blink_edu.model.bundled import resolve_model_dir
from blink_edu.model.weights import load_weights

@pytest.fixture(scope="module")
def weights():
    return load_weights(resolve_model_dir())


def by_choice(chunks, chat: bool = False) -> dict[int, dict]:
    """A stream's chunks gathered per choice index: text, finish reason, logprobs entries."""
    out = defaultdict(lambda: {"text": "", "finish_reason": None, "logprobs": []})
    for chunk in chunks:
        for c in chunk.choices:
            got = out[c.index]
            got["text"] += (c.delta.content or "") if chat else c.text
            got["finish_reason"] = c.finish_reason or got["finish_reason"]
            if c.logprobs is not None:
                got["logprobs"] += (c.logprobs.content if chat else
                                    list(zip(c.logprobs.tokens, c.logprobs.token_logprobs,
                                             c.logprobs.top_logprobs)))
    return dict(out)


def complete_both(client, **kwargs):
    """(the whole answer, the streamed one gathered per choice)."""
    whole = client.completions.create(model=MODEL, **kwargs)
    streamed = by_choice(client.completions.create(model=MODEL, stream=True, **kwargs))
    return whole, streamed


def reference_text(weights, tokenizer, prompt: str, **params) -> str:
    ids = reference.generate(weights, [tokenizer.encode(prompt)],
                             SamplingParams(ignore_eos=True, **params))[0]
    return tokenizer.decode(ids)


def test_model_by_id(client):
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("gpt-17")
    assert err.value.body["code"] == "model_not_found"


@pytest.mark.parametrize("adjust", ["ban", "force", "penalties"])
def test_logit_adjustments_give_the_reference_tokens(client, weights, tokenizer, adjust, rng):
    plain = reference.generate(weights, [tokenizer.encode(PROMPT)],
                               SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    forced = int(rng.integers(100, weights.config.vocab_size))
    params = {"ban": dict(logit_bias=((plain[0], -100.0), (plain[1], -100.0))),
              "force": dict(logit_bias=((forced, 100.0),)),
              "penalties": dict(frequency_penalty=float(rng.uniform(0.5, 2)),
                                presence_penalty=float(rng.uniform(0.5, 2)))}[adjust]
    expected = reference_text(weights, tokenizer, PROMPT, temperature=0, max_tokens=12, **params)
    body = {"logit_bias": {str(t): b for t, b in params.get("logit_bias", ())}, **LONG}
    whole, streamed = complete_both(
        client, prompt=PROMPT, max_tokens=12, temperature=0, extra_body=body,
        presence_penalty=params.get("presence_penalty", 0.0),
        frequency_penalty=params.get("frequency_penalty", 0.0))
    assert whole.choices[0].text == expected == streamed[0]["text"]
    if adjust == "force":
        assert expected == tokenizer.decode([forced] * 12)
    else:
        assert expected != tokenizer.decode(plain), "the adjustment changed nothing"


def test_n_choices_each_sample_from_their_own_seed(client):
    kwargs = dict(prompt=PROMPT, max_tokens=10, temperature=1.0, seed=1234, extra_body=LONG)
    whole, streamed = complete_both(client, n=3, **kwargs)
    assert [c.index for c in whole.choices] == [0, 1, 2]
    singles = [client.completions.create(model=MODEL, **{**kwargs, "seed": 1234 + i})
               .choices[0].text for i in range(3)]
    assert [c.text for c in whole.choices] == singles == [streamed[i]["text"] for i in range(3)]
    assert len(set(singles)) > 1, "three seeds gave one text"
    assert whole.usage.completion_tokens == 30
    assert {streamed[i]["finish_reason"] for i in range(3)} == {"length"}


def test_a_list_of_prompts_with_n(client):
    prompts = [PROMPT, "The sea is"]
    whole, streamed = complete_both(client, prompt=prompts, n=2, max_tokens=6, temperature=0,
                                    extra_body=LONG)
    assert [c.index for c in whole.choices] == [0, 1, 2, 3]  # prompt * n + choice
    for p, prompt in enumerate(prompts):
        alone = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6,
                                          temperature=0, extra_body=LONG).choices[0].text
        assert whole.choices[2 * p].text == whole.choices[2 * p + 1].text == alone  # greedy
    assert [c.text for c in whole.choices] == [streamed[i]["text"] for i in range(4)]


def test_echo_puts_the_prompt_first(client):
    whole, streamed = complete_both(client, prompt=PROMPT, echo=True, max_tokens=8,
                                    temperature=0, extra_body=LONG)
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0,
                                      extra_body=LONG).choices[0].text
    assert whole.choices[0].text == PROMPT + plain == streamed[0]["text"]


def test_completion_logprobs(client):
    whole, streamed = complete_both(client, prompt=PROMPT, max_tokens=8, temperature=0,
                                    logprobs=3, extra_body=LONG)
    lp = whole.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 8
    assert "".join(lp.tokens) == whole.choices[0].text
    assert lp.text_offset == list(np.cumsum([0] + [len(t) for t in lp.tokens[:-1]]))
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert logprob <= 0 and 1 <= len(top) <= 3
        assert logprob == pytest.approx(max(top.values()))  # greedy: the most likely token
        assert top.get(token) == pytest.approx(logprob)
    assert streamed[0]["logprobs"] == list(zip(lp.tokens, lp.token_logprobs, lp.top_logprobs))
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0,
                                      extra_body=LONG)
    assert plain.choices[0].logprobs is None and plain.choices[0].text == whole.choices[0].text


def test_chat_logprobs(client):
    kwargs = dict(messages=CHAT, max_completion_tokens=6, temperature=0, logprobs=True,
                  top_logprobs=2, extra_body=LONG)
    whole = client.chat.completions.create(model=MODEL, **kwargs)
    streamed = by_choice(client.chat.completions.create(model=MODEL, stream=True, **kwargs),
                         chat=True)
    content = whole.choices[0].logprobs.content
    assert len(content) == 6 == whole.usage.completion_tokens
    assert "".join(c.token for c in content) == whole.choices[0].message.content
    for entry in content:
        assert entry.bytes == list(entry.token.encode())
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
    assert streamed[0]["text"] == whole.choices[0].message.content
    assert [e.model_dump() for e in streamed[0]["logprobs"]] == [e.model_dump() for e in content]
