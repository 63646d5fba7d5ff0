"""Seeded prompts for the serving benchmark: real English text cut to an exact token length.

Blink §5's serving load and vLLM's ``benchmark_serving.py``: the lengths and arrival times come
from ``sim.workload`` (one seeded workload replayed for every variant, docs/design.md §9); this
module turns a length into text that the server's tokenizer counts as exactly that many tokens
(BOS included), so the server's ``usage.prompt_tokens`` equals the intended length and the
benchmark can check it per request.

    rng = np.random.default_rng(seed)
    lens = lognormal_lengths(rng, 24, input_mean=128, input_sigma=0.7, output_mean=64,
                             output_sigma=0.7, max_model_len=512)       # sim.workload
    prompts = PromptBuilder(tokenizer).build(lens, rng)         # [WorkItem(text, lengths)]
"""

from __future__ import annotations

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
