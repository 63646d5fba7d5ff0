"""The offline API: a list of prompts in, their completions out, in order (vLLM's ``LLM``).

docs/design.md §2 and §8; nano-vllm's ``LLM``. Everything is queued at once and the engine batches it
continuously, step by step, until every request has finished:

    llm = LLM("path/to/model")          # None: the bundled model
    outs = llm.generate(["The sky is", "Once upon a time"], SamplingParams(max_tokens=32))
    print(outs[0].text)

Prompts are strings (tokenized with the model folder's tokenizer) or lists of token ids (which
need no tokenizer: the tiny test checkpoints have none).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from .config import EngineConfig, SamplingParams
from .engine.llm_engine import LLMEngine
from .model.bundled import resolve_model_dir
from .model.tokenizer import Tokenizer
from .model.weights import load_weights


@dataclass
class CompletionOutput:
    prompt: str | list[int]  # as given
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated, including the stop token if one ended it
    text: str | None  # the generated text; None when the model folder has no tokenizer
    finish_reason: str  # "stop" | "length"


class LLM:
    def __init__(self, model: str | Path | None = None, engine_config: EngineConfig | None = None,
                 dtype=np.float32):
        """``model``: a Hugging Face model folder (None: the bundled one). ``dtype``: the
        weights' NumPy dtype (float64 makes greedy comparisons immune to rounding)."""
        folder = resolve_model_dir(model)
        has_tokenizer = (folder / "tokenizer.json").is_file()
        self.tokenizer = Tokenizer.from_folder(folder) if has_tokenizer else None
        weights = load_weights(folder, dtype=dtype)
        eos = weights.config.eos_token_ids + (self.tokenizer.eos_ids if self.tokenizer else ())
        self.engine = LLMEngine(weights, engine_config, eos_token_ids=tuple(dict.fromkeys(eos)))

    def generate(self, prompts,
                 sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[CompletionOutput]:
        """Complete every prompt; results in the order of ``prompts``. ``sampling_params``: one
        for all prompts or a list with one per prompt (default: ``SamplingParams()``)."""
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        params = (list(sampling_params) if isinstance(sampling_params, (list, tuple))
                  else [sampling_params or SamplingParams()] * len(prompts))
        if len(params) != len(prompts):
            raise ValueError(f"{len(params)} SamplingParams for {len(prompts)} prompts")
        prompt_ids = [self._prompt_token_ids(i, p) for i, p in enumerate(prompts)]
        order = self._add_all(prompt_ids, params)  # request id -> index in prompts
        generated: list[list[int]] = [[] for _ in prompts]
        reasons: list[str | None] = [None] * len(prompts)
        bar = tqdm(total=len(prompts), desc="Generating", unit="req", disable=not use_tqdm)
        start, num_tokens = time.perf_counter(), 0
        while self.engine.has_unfinished():
            for out in self.engine.step():
                i = order.get(out.request_id)
                if i is None:
                    continue  # someone else's request on the same engine
                generated[i].append(out.token_id)
                num_tokens += 1
                if out.finished:
                    reasons[i] = out.finish_reason
                    bar.update(1)
            bar.set_postfix(tok_s=f"{num_tokens / (time.perf_counter() - start):.1f}")
        bar.close()
        return [CompletionOutput(prompt, ids, tokens, self._decode(tokens), reason)
                for prompt, ids, tokens, reason in zip(prompts, prompt_ids, generated, reasons)]

    def _prompt_token_ids(self, index: int, prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(f"prompt {index} is text, but the model folder has no "
                                 f"tokenizer.json: pass token ids instead")
            return self.tokenizer.encode(prompt)
        if isinstance(prompt, (list, tuple, np.ndarray)):
            return [int(t) for t in prompt]
        raise ValueError(f"prompt {index} must be a str or a list of token ids, "
                         f"got {type(prompt).__name__}")

    def _add_all(self, prompt_ids: list[list[int]], params: list[SamplingParams]) -> dict:
        """Queue every request, or none: a bad one cancels those already queued."""
        order = {}
        try:
            for i, (ids, p) in enumerate(zip(prompt_ids, params)):
                order[self.engine.add_request(ids, p)] = i
        except ValueError as err:
            for request_id in order:
                self.engine.abort(request_id)
            raise ValueError(f"prompt {len(order)}: {err}") from None
        return order

    def _decode(self, token_ids: list[int]) -> str | None:
        return self.tokenizer.decode(token_ids) if self.tokenizer else None
