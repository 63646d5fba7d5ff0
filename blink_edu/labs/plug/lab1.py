"""Lab 1's plug: the eager executor, launching the lab's kernels instead of the project's.

``LabExecutor`` is ``engine.kernel_executor.EagerExecutor`` — same buffers, same buckets, same
order of launches — whose ``launch_linear`` (``use="gemv"``) and/or ``launch_attention``
(``use="attention"``) send the op to ``implementation(1)``'s kernels. Everything else (embedding,
RoPE + KV write, SwiGLU, sampling) is the project's. ``LLMEngine(weights, config,
executor=LabExecutor(...))`` then generates tokens with your kernels inside.
"""

from __future__ import annotations

import numpy as np

from .. import implementation, require
from ...config import EngineConfig, ModelConfig, SamplingParams
from ...executors.kernel_executor import EagerExecutor
from ...engine.llm_engine import LLMEngine
from ...kernels.reduce import THREADS, cuda
from ...model.weights import random_weights

# A micro model: every simulated CUDA thread is a Python thread. Four query heads over two kv
# heads, so that a wrong grouped-query mapping generates wrong tokens.
MICRO = dict(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=48,
             num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=64, rope_theta=10000.0, rms_norm_eps=1e-5,
             tie_word_embeddings=True, eos_token_id=2)
MICRO_ENGINE = EngineConfig(executor="eager", block_size=4, num_kv_blocks=8, max_num_seqs=2,
                            max_num_batched_tokens=8, max_model_len=32)
USES = ("gemv", "attention")


def blocks_for(n_items: int) -> int:
    """The lab kernels' grid: one thread per work item, THREADS per block."""
    return max(1, -(-n_items // THREADS))


def micro_weights(seed: int = 0):
    return random_weights(ModelConfig.from_dict(MICRO), seed=seed, scale=0.4)


# --- launching a lab kernel (checked for stubs first) -----------------------------------------
def launch_gemv(x, x_rows, norm_w, eps, w, bias, out, accumulate, stream=0, impl=None):
    impl = impl or implementation(1)
    require(impl.inv_rms, "1.1") if norm_w.shape[0] > 0 else None
    require(impl.rmsnorm_gemv_kernel, "1.2")
    grid = blocks_for(x_rows.shape[0] * w.shape[0])
    impl.rmsnorm_gemv_kernel[grid, THREADS, stream](x, x_rows, norm_w, eps, w, bias, out,
                                                    accumulate)


def launch_attention(qkv, positions, seq_rows, block_tables, kv_pool, layer, num_heads,
                     num_kv_heads, out, stream=0, impl=None):
    impl = impl or implementation(1)
    require(impl.paged_attention_kernel, "1.3")
    grid = blocks_for(qkv.shape[0] * num_heads)
    impl.paged_attention_kernel[grid, THREADS, stream](qkv, positions, seq_rows, block_tables,
                                                       kv_pool, layer, num_heads, num_kv_heads,
                                                       out)


def inv_rms_rows(x: np.ndarray, eps: float, impl=None) -> np.ndarray:
    """(T,) inv_rms of every row of x (T, I), computed by the lab's device function."""
    impl = impl or implementation(1)
    require(impl.inv_rms, "1.1")
    device_fn = impl.inv_rms

    @cuda.jit
    def probe(x, eps, out):
        r = cuda.grid(1)
        if r < x.shape[0]:
            out[r] = device_fn(x, r, eps)

    out = cuda.to_device(np.full(x.shape[0], np.nan, np.float32))
    probe[blocks_for(x.shape[0]), THREADS](cuda.to_device(np.ascontiguousarray(x, np.float32)),
                                            np.float32(eps), out)
    return out.copy_to_host()


# --- the executor -------------------------------------------------------------------------------
class LabExecutor(EagerExecutor):
    """The eager executor with the lab's kernels for the ops named in ``use``."""

    name = "lab1"

    def __init__(self, weights, engine_config: EngineConfig = MICRO_ENGINE, use=USES, **kwargs):
        unknown = set(use) - set(USES)
        if unknown:
            raise ValueError(f"use= takes {USES}, not {sorted(unknown)}")
        # every linear through launch_linear: no GEMV with RoPE or SwiGLU in its epilogue
        super().__init__(weights, engine_config, fuse_epilogues=False, **kwargs)
        self.use = tuple(use)
        self.impl = implementation(1)
        self.launches = {"lab": 0, "project": 0}  # kernels launched, whose (for the notebook)

    def launch_linear(self, x, rows, norm, w, b, out, accumulate) -> None:
        if "gemv" not in self.use:
            self.launches["project"] += 1
            return super().launch_linear(x, rows, norm, w, b, out, accumulate)
        self.launches["lab"] += 1
        launch_gemv(x, rows, norm, np.float32(self.config.rms_norm_eps), w, b, out, accumulate,
                    self.stream, self.impl)

    def launch_attention(self, qkv, positions, seq_rows, block_tables, layer, out,
                         prompt_chunks=False) -> None:
        if "attention" not in self.use:
            self.launches["project"] += 1
            return super().launch_attention(qkv, positions, seq_rows, block_tables, layer, out,
                                            prompt_chunks)
        self.launches["lab"] += 1
        launch_attention(qkv, positions, seq_rows, block_tables, self.kv_pool, layer,
                         self.config.num_heads, self.config.num_kv_heads, out, stream=self.stream,
                         impl=self.impl)


def generate(weights, prompts, params: SamplingParams, use=USES,
             engine_config: EngineConfig = MICRO_ENGINE) -> list[list[int]]:
    """Generate with ``LLMEngine`` over a ``LabExecutor``: the tokens of each prompt."""
    executor = LabExecutor(weights, engine_config, use=use)
    engine = LLMEngine(weights, engine_config, executor=executor)
    ids = [engine.add_request(p, params) for p in prompts]
    out = {i: [] for i in ids}
    while engine.has_unfinished():
        for o in engine.step():
            out[o.request_id].append(o.token_id)
    return [out[i] for i in ids]
