"""Seeded serving workloads: who arrives when, with how long a prompt, asking for how many tokens.

DESIGN.md §9 ("same work for every variant: one seeded workload file per experiment, replayed for
each executor or policy") and the load model of vLLM's ``benchmark_serving.py``:

* **arrivals** — a Poisson process at ``rate`` requests/s (exponential gaps), or a Gamma process
  with the same mean rate and shape ``burstiness`` (1 = Poisson; < 1 burstier; > 1 more even);
  ``rate = inf`` sends every request at once;
* **lengths** — ShareGPT-like log-normal prompt and output lengths (long right tail), clipped so
  that prompt + output fits the model's context; or fixed lengths;
* **prompts** — real English text cut to exactly the wanted number of tokens *as the server's
  tokenizer counts them* (BOS included), so the server's ``usage.prompt_tokens`` equals the
  intended length and a benchmark can check it per request.

    rng = np.random.default_rng(seed)
    lens = lognormal_lengths(rng, 24, input_mean=128, input_sigma=0.7, output_mean=64,
                             output_sigma=0.7, max_model_len=512)
    prompts = PromptBuilder(tokenizer).build(lens, rng)         # [(text, prompt_len, output_len)]
    t = arrival_times(np.random.default_rng([seed, 1]), 24, rate=2.0)   # seconds from the start
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

# Plain English prose (written for this project), tiled as often as a prompt needs.
ENGLISH_TEXT = """\
The harbour town woke slowly in winter. Before the light came over the hills, the bakers had
already lit their ovens, and the smell of bread drifted down the narrow streets to the water,
where the fishermen were mending their nets and arguing about the weather. An old woman kept
the lamp at the end of the pier, and every morning she climbed the steps to put it out, counting
them aloud as if one of them might have vanished in the night.

In the square, the clock had been wrong for as long as anyone could remember. The council had
voted three times to repair it and three times had spent the money on something else: a new
roof for the school, a wall against the spring floods, a bell for the chapel that nobody liked.
So the town kept two times, the clock's and the sun's, and most people were content to be late
by one or early by the other.

The schoolmaster was a patient man who believed that every child could learn to read, provided
the book was interesting enough. He wrote his own stories when the ones he had ran out, and he
read them to the class on Friday afternoons, stopping always at the most exciting moment, so that
the children would come back on Monday. Some of his stories were about ships, some about kings,
and one, which the children asked for again and again, was about a lighthouse that fell in love
with a star.

When the ships came in at evening, the whole town went down to the harbour to see what they had
brought. There were barrels of salt and boxes of tea, letters from cousins in distant cities,
and once, to everyone's delight, a small grey monkey that belonged to no one and stayed for
seven years. The sailors told stories that grew longer every time they were told, and the
children repeated them in the streets until the stories belonged to the town as much as to the
sea.

In the spring the fields above the town turned green, and the farmers walked their rows with
their hands behind their backs, looking at the sky. They spoke little and trusted less, but when
the rain came at the right time they would stand in the doorway of the inn and laugh at nothing
at all. By summer the roads were dusty, the river was low, and the evenings were long enough for
music in the square, where the wrong clock looked down on the dancers and struck thirteen.
"""


@dataclass(frozen=True)
class WorkItem:
    """One request of a workload: its prompt and how many tokens to ask for."""
    index: int
    prompt: str
    prompt_len: int  # tokens, as the server's tokenizer counts them (BOS included)
    output_len: int  # max_tokens; with ignore_eos the server generates exactly this many

    def as_dict(self) -> dict:
        return asdict(self)


def lognormal_lengths(rng: np.random.Generator, n: int, *, input_mean: float, input_sigma: float,
                      output_mean: float, output_sigma: float, max_model_len: int,
                      min_input: int = 4, min_output: int = 2) -> list[tuple[int, int]]:
    """``n`` (prompt_len, output_len) pairs, each log-normal with the given *mean* (in tokens)
    and log-space ``sigma``; clipped so that ``min_input <= prompt``, ``min_output <= output``
    and ``prompt + output <= max_model_len``. (The mean is the unclipped distribution's:
    ``mu = ln(mean) - sigma**2 / 2``.)"""
    if min_input + min_output > max_model_len:
        raise ValueError(f"the context ({max_model_len}) cannot hold {min_input} + {min_output}")

    def draw(mean, sigma):
        mu = math.log(mean) - sigma ** 2 / 2
        return np.rint(rng.lognormal(mu, sigma, size=n)).astype(int)

    inputs, outputs = draw(input_mean, input_sigma), draw(output_mean, output_sigma)
    pairs = []
    for p, o in zip(inputs, outputs):
        p = int(np.clip(p, min_input, max_model_len - min_output))
        o = int(np.clip(o, min_output, max_model_len - p))
        pairs.append((p, o))
    return pairs


def fixed_lengths(n: int, input_len: int, output_len: int, max_model_len: int) -> list[tuple[int, int]]:
    if input_len < 1 or output_len < 1 or input_len + output_len > max_model_len:
        raise ValueError(f"--input-len {input_len} + --output-len {output_len} must fit the "
                         f"{max_model_len}-token context (each at least 1)")
    return [(input_len, output_len)] * n


def arrival_times(rng: np.random.Generator, n: int, rate: float, burstiness: float = 1.0) -> list[float]:
    """Send times in seconds from the start: the first at 0, then Gamma(shape=burstiness,
    scale=1/(rate*burstiness)) gaps — mean gap 1/rate; burstiness 1 is a Poisson process.
    ``rate = inf``: everything at 0."""
    if n <= 0:
        return []
    if math.isinf(rate):
        return [0.0] * n
    if rate <= 0 or burstiness <= 0:
        raise ValueError("rate and burstiness must be positive")
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n - 1)
    return [0.0] + np.cumsum(gaps).tolist()


class PromptBuilder:
    """Cuts ``ENGLISH_TEXT`` (tiled) into prompts of an exact token length for ``tokenizer``.

    A prompt of ``n`` tokens is the decoded text of ``n - bos`` consecutive corpus tokens from a
    seeded offset; decoding and re-encoding can merge tokens differently at the edges, so the
    count is checked with ``tokenizer.encode`` (what the server does) and nudged until exact."""

    def __init__(self, tokenizer, text: str = ENGLISH_TEXT, max_len: int = 4096):
        self.tokenizer = tokenizer
        self.bos = 1 if tokenizer.add_bos_token else 0
        one = tokenizer.encode(text, add_bos=False)
        repeats = max(2, -(-2 * max_len // max(len(one), 1)) + 1)
        self.ids = tokenizer.encode(" ".join([text.strip()] * repeats), add_bos=False)
        self.max_len = max_len

    def prompt(self, n: int, offset: int) -> str:
        """Text that ``tokenizer.encode`` turns into exactly ``n`` ids (BOS included)."""
        if not self.bos < n <= self.max_len:
            raise ValueError(f"prompt length {n} outside ({self.bos}, {self.max_len}]")
        for attempt in range(8):  # bounded: a few offsets, a few nudges each
            start = (offset + 17 * attempt) % (len(self.ids) - 2 * n - 8)
            take = n - self.bos
            for _ in range(6):
                text = self.tokenizer.decode(self.ids[start:start + take])
                got = len(self.tokenizer.encode(text))
                if got == n:
                    return text
                take += n - got
                if take < 1:
                    break
        raise RuntimeError(f"could not build a prompt of exactly {n} tokens")

    def build(self, lengths: list[tuple[int, int]], rng: np.random.Generator) -> list[WorkItem]:
        offsets = rng.integers(0, len(self.ids) // 2, size=len(lengths))
        return [WorkItem(i, self.prompt(p, int(off)), p, o)
                for i, ((p, o), off) in enumerate(zip(lengths, offsets))]
