"""The kernel executors: the model as Numba CUDA kernels, driven by the host — eager or graph.

docs/design.md §2 ("three executors, one model") and Blink §2 (why host-driven loops are slow).
Both executors run the *same* kernel launches on the *same* buffers; they differ only in who
issues them:

* ``EagerExecutor`` — a Python loop launches every kernel of every step: 1 embedding gather,
  7 per layer (norm+qkv, rope+kv-write, attention, o-proj+residual, norm+gate/up, SwiGLU,
  down+residual), the LM head and the sampler; 5 per layer at batch 1, where RoPE and SwiGLU ride
  in the epilogue of the projection before them, as they do for a decode batch on tensor cores
  (``forward_ops.fused_into_linear``; ``fuse_epilogues=False`` keeps all seven, to measure what
  the fusion buys or to route every linear through ``launch_linear``). Each launch costs tens of
  microseconds of host time, so at small batch the GPU mostly waits for Python.
* ``GraphExecutor`` — the same launches are captured once per *bucket* into a CUDA graph
  (together with the input and output copies) and each step replays one graph: one launch.

**Buckets.** A graph has fixed shapes, so a step's ``S`` sequences and ``T`` tokens are padded up
to a bucket ``(S_b, T_b)``, both powers of two; a precomputed table maps any ``(S, T)`` to its
bucket in O(1). Padding tokens and padding sequences point at a scratch KV block that no sequence
owns, so their work is harmless and ignored. The eager executor pads the same way, so the two
run identical kernels and can be compared fairly.

Weights are uploaded once, in fused layouts: ``[Wq; Wk; Wv]`` as one matrix (one GEMV instead of
three) and ``[W_gate; W_up]`` as one (SwiGLU reads both halves).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..backend import get_backend
from ..config import EngineConfig
from ..kernels.attention import attention_kernel, attention_scratch, uses_attention_tiles
from ..kernels.elementwise import embed_tokens_kernel, swiglu_kernel
from ..kernels.linear import (launch_linear, launch_linear_qkv_rope, launch_linear_swiglu,
                              uses_tensor_cores)
from ..kernels.reduce import THREADS, cuda, grid_for
from ..kernels.rope import rope_and_write_kv_kernel
from ..kernels.sampling import adjust_logits_kernel, sample_rows_kernel
from ..kv.block_manager import blocks_needed
from ..kv.pool import allocate_kv_pool
from ..model.reference import rope_tables
from ..model.weights import ModelWeights
from .forward_ops import (ATTENTION, DOWN, EMBED, GATE_UP, LM_HEAD, O_PROJ, OP_NAMES, QKV,
                          ROPE_KV, SAMPLE, SWIGLU, fused_into_linear, num_ops, op_grid, op_of)
from .step import StepBatch, padded_step_shape


def powers_of_two_upto(limit: int) -> list[int]:
    sizes = [1]
    while sizes[-1] < limit:
        sizes.append(sizes[-1] * 2)
    return sizes


class BucketTable:
    """O(1) map from a step's (sequences, tokens) to the padded shape its graph was captured at
    (``step.padded_step_shape``)."""

    def __init__(self, max_seqs: int, max_tokens: int):
        self.seq_sizes = powers_of_two_upto(max_seqs)
        self.token_sizes = powers_of_two_upto(max_tokens)
        self._seq_bucket = np.array([padded_step_shape(n, 0)[0]
                                     for n in range(self.seq_sizes[-1] + 1)])
        self._token_bucket = np.array([padded_step_shape(0, n)[1]
                                       for n in range(self.token_sizes[-1] + 1)])

    def __call__(self, num_seqs: int, num_tokens: int) -> tuple[int, int]:
        if num_seqs > self.seq_sizes[-1] or num_tokens > self.token_sizes[-1]:
            raise ValueError(f"step of {num_seqs} sequences / {num_tokens} tokens exceeds the "
                             f"largest bucket ({self.seq_sizes[-1]}, {self.token_sizes[-1]})")
        s = int(self._seq_bucket[num_seqs])
        return s, max(s, int(self._token_bucket[num_tokens]))  # every sequence has >= 1 token

    def all_buckets(self) -> list[tuple[int, int]]:
        return [(s, t) for s in self.seq_sizes for t in self.token_sizes if t >= s]


def _empty():
    return cuda.to_device(np.zeros(0, np.float32))


@dataclass
class DeviceLayer:
    attn_norm: object  # (D,) f32
    w_qkv: object  # ((H + 2K) * E, D)
    b_qkv: object  # ((H + 2K) * E,) or (0,)
    w_o: object  # (D, H * E)
    b_o: object  # (D,) or (0,)
    mlp_norm: object  # (D,)
    w_gate_up: object  # (2F, D)
    b_gate_up: object  # (2F,) or (0,)
    w_down: object  # (D, F)
    b_down: object  # (D,) or (0,)


def _cat(*arrays):
    return None if arrays[0] is None else np.concatenate(arrays, axis=0)


MATRICES = ("w_qkv", "w_o", "w_gate_up", "w_down")  # in the kernels' weight dtype; the rest f32


def fused_layer(lw) -> dict:
    """One layer's host arrays in the kernels' fused layouts (``DeviceLayer``'s fields; an absent
    bias is None). Every executor uploads these: the single definition of the layouts."""
    return dict(attn_norm=lw.attn_norm, w_qkv=_cat(lw.wq, lw.wk, lw.wv),
                b_qkv=_cat(lw.bq, lw.bk, lw.bv), w_o=lw.wo, b_o=lw.bo, mlp_norm=lw.mlp_norm,
                w_gate_up=_cat(lw.w_gate, lw.w_up), b_gate_up=_cat(lw.b_gate, lw.b_up),
                w_down=lw.w_down, b_down=lw.b_down)


def upload_weights(weights: ModelWeights, weight_dtype=np.float32):
    """Weights on the device, in the fused layouts; norms and biases stay float32."""
    def mat(a):
        return cuda.to_device(np.ascontiguousarray(a, dtype=weight_dtype))

    def vec(a):
        return _empty() if a is None else cuda.to_device(np.ascontiguousarray(a, np.float32))

    layers = [DeviceLayer(**{name: mat(a) if name in MATRICES else vec(a)
                             for name, a in fused_layer(lw).items()}) for lw in weights.layers]
    embed = mat(weights.embed)
    lm_head = embed if weights.lm_head is weights.embed else mat(weights.lm_head)
    return embed, layers, vec(weights.final_norm), lm_head


class EagerExecutor:
    """Runs each step as one Python-issued launch per op (see the module docstring)."""

    name = "eager"

    def __init__(self, weights: ModelWeights, engine_config: EngineConfig,
                 weight_dtype=np.float32, max_model_len: int | None = None,
                 fuse_epilogues: bool = True):
        cfg = self.config = weights.config
        self.fuse_epilogues = fuse_epilogues
        self.eps = np.float32(cfg.rms_norm_eps)
        self.backend = get_backend()
        self.block_size = B = engine_config.block_size
        self.max_model_len = max_model_len or engine_config.max_model_len or cfg.max_position_embeddings
        self.buckets = BucketTable(engine_config.max_num_seqs, engine_config.max_num_batched_tokens)
        max_s, max_t = self.buckets.seq_sizes[-1], self.buckets.token_sizes[-1]
        self.scratch_block = engine_config.num_kv_blocks  # owned by nobody: padding writes here
        self.width = blocks_needed(self.max_model_len, B)  # block-table width W
        self.stream = self._make_stream()
        self.embed, self.layers, self.final_norm, self.lm_head = upload_weights(weights, weight_dtype)
        cos, sin = rope_tables(cfg, np.arange(self.max_model_len))  # (P, E/2)
        self.cos, self.sin = cuda.to_device(cos), cuda.to_device(sin)
        self.kv_pool = cuda.to_device(allocate_kv_pool(cfg, engine_config.num_kv_blocks + 1, B))
        H, K, E, D, F = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size, cfg.intermediate_size
        f32 = np.float32
        # device buffers at the largest bucket; each bucket uses leading views of them
        self.x = cuda.device_array((max_t, D), f32)  # residual stream
        self.qkv = cuda.device_array((max_t, (H + 2 * K) * E), f32)
        self.attn = cuda.device_array((max_t, H * E), f32)
        self.gate_up = cuda.device_array((max_t, 2 * F), f32)
        self.act = cuda.device_array((max_t, F), f32)
        self.logits = cuda.device_array((max_s, cfg.vocab_size), f32)
        self.attn_partials, self.attn_arrivals = attention_scratch(E)  # attention's splits
        self.all_rows = cuda.to_device(np.arange(max_t, dtype=np.int32))
        self.row_scale = cuda.device_array(max_t, f32)  # the tensor-core tile's 1 / rms per row
        self.tensor_cores = uses_tensor_cores(weight_dtype)  # batched steps on tensor cores
        self.num_sms = 1 if self.backend.is_simulator else \
            cuda.get_current_device().MULTIPROCESSOR_COUNT
        # step inputs: host staging (pinned on a GPU) and their device twins
        self.host = self._host_inputs(max_s, max_t)
        self.dev = {k: cuda.to_device(v) for k, v in self.host.items()}
        self._views: dict[tuple[int, int], dict] = {}
        self._adjustments = None  # this step's logit adjustments on the device (stage_adjustments)
        self.logits_out = None  # (S, V) the last step's logits, when it asked for logprobs

    # --- plumbing --------------------------------------------------------------------------
    def _make_stream(self):
        if self.backend.is_simulator:
            return 0
        import cupy

        self._cupy_stream = cupy.cuda.Stream(non_blocking=True)
        return cuda.external_stream(self._cupy_stream.ptr)

    def _host_inputs(self, max_s: int, max_t: int) -> dict[str, np.ndarray]:
        def buf(shape, dtype):
            if self.backend.is_simulator:
                return np.zeros(shape, dtype)
            return cuda.pinned_array(shape, dtype)

        return dict(
            token_ids=buf(max_t, np.int32), positions=buf(max_t, np.int32),
            seq_rows=buf(max_t, np.int32), block_tables=buf((max_s + 1, self.width), np.int32),
            logit_rows=buf(max_s, np.int32), temperature=buf(max_s, np.float32),
            top_p=buf(max_s, np.float32), top_k=buf(max_s, np.int32),
            seeds=buf(max_s, np.uint32), counters=buf(max_s, np.int32), tokens=buf(max_s, np.int32))

    def bucket_views(self, s_b: int, t_b: int) -> dict:
        """Device views shaped for bucket (S_b, T_b): kernels read their sizes from the shapes."""
        key = (s_b, t_b)
        if key not in self._views:
            d = self.dev
            self._views[key] = dict(
                x=self.x[:t_b], qkv=self.qkv[:t_b], attn=self.attn[:t_b],
                gate_up=self.gate_up[:t_b], act=self.act[:t_b], logits=self.logits[:s_b],
                rows=self.all_rows[:t_b], token_ids=d["token_ids"][:t_b],
                positions=d["positions"][:t_b], seq_rows=d["seq_rows"][:t_b],
                block_tables=d["block_tables"][:s_b + 1], logit_rows=d["logit_rows"][:s_b],
                temperature=d["temperature"][:s_b], top_p=d["top_p"][:s_b], top_k=d["top_k"][:s_b],
                seeds=d["seeds"][:s_b], counters=d["counters"][:s_b], tokens=d["tokens"][:s_b])
        return self._views[key]

    def stage_inputs(self, batch: StepBatch, s_b: int, t_b: int) -> None:
        """Write the step (padded to its bucket) into the host staging buffers."""
        h, S, T = self.host, batch.num_seqs, batch.num_tokens
        dummy_row = s_b  # padding rows/tokens use the last table row: all scratch block
        h["block_tables"][: s_b + 1] = self.scratch_block
        h["block_tables"][:S, : batch.block_tables.shape[1]] = np.where(
            batch.block_tables >= 0, batch.block_tables, self.scratch_block)
        for name, value, pad in (("token_ids", batch.token_ids, 0), ("positions", batch.positions, 0),
                                 ("seq_rows", batch.seq_rows, dummy_row)):
            h[name][:T] = value
            h[name][T:t_b] = pad
        for name, value, pad in (("logit_rows", batch.logit_rows, 0), ("temperature", batch.temperature, 0),
                                 ("top_p", batch.top_p, 1), ("top_k", batch.top_k, 0),
                                 ("seeds", batch.seeds, 0), ("counters", batch.counters, 0)):
            h[name][:S] = value
            h[name][S:s_b] = pad

    def copy_inputs(self, s_b: int, t_b: int) -> None:
        v, h, stream = self.bucket_views(s_b, t_b), self.host, self.stream
        for name in ("token_ids", "positions", "seq_rows"):
            v[name].copy_to_device(h[name][:t_b], stream=stream)
        v["block_tables"].copy_to_device(h["block_tables"][: s_b + 1], stream=stream)
        for name in ("logit_rows", "temperature", "top_p", "top_k", "seeds", "counters"):
            v[name].copy_to_device(h[name][:s_b], stream=stream)

    def copy_outputs(self, s_b: int, t_b: int) -> None:
        self.bucket_views(s_b, t_b)["tokens"].copy_to_host(self.host["tokens"][:s_b], stream=self.stream)

    # --- the model, as launches ------------------------------------------------------------
    def launch_forward(self, s_b: int, t_b: int, probe=None) -> None:
        """Every kernel of one step, in ``forward_ops``' order (the op list every executor runs),
        on ``self.stream``. ``probe(name)``, if given, is called before each launch with the op's
        name and once more with ``None`` at the end: profilers and chapters hook in there (see
        ``bench/decode.py``'s op breakdown)."""
        probe = probe or (lambda name: None)
        views = self.bucket_views(s_b, t_b)
        for k in range(num_ops(self.config.num_layers)):
            op, layer = op_of(k, self.config.num_layers)
            if self.fuses(op, t_b):
                continue
            if op == SAMPLE and self._adjustments is not None:  # only in a step that has some
                probe("adjust")  # (never captured)
                adjust_logits_kernel[grid_for(s_b), THREADS, self.stream](views["logits"],
                                                                          *self._adjustments)
            probe(OP_NAMES[op])
            self.launch_op(op, layer, views, s_b, t_b)
        probe(None)

    def launch_op(self, op: int, i: int, v: dict, s_b: int, t_b: int) -> None:
        """One op of ``forward_ops`` (of layer ``i``) as one launch over bucket (S_b, T_b)'s
        views ``v``: the same device functions the persistent kernel runs between barriers."""
        cfg, st = self.config, self.stream
        grid = op_grid(op, t_b, s_b, cfg)
        empty = self.final_norm[:0]
        lw = self.layers[i]
        if op == EMBED:
            embed_tokens_kernel[grid, THREADS, st](self.embed, v["token_ids"], v["x"])
        elif op == QKV and self.fuses(ROPE_KV, t_b):
            launch_linear_qkv_rope(v["x"], v["rows"], lw.attn_norm, self.eps, lw.w_qkv, lw.b_qkv,
                                   v["qkv"], v["positions"], v["seq_rows"], v["block_tables"],
                                   self.cos, self.sin, self.kv_pool, i, cfg.num_heads,
                                   cfg.num_kv_heads, st)
        elif op == QKV:
            self.launch_linear(v["x"], v["rows"], lw.attn_norm, lw.w_qkv, lw.b_qkv, v["qkv"], 0)
        elif op == ROPE_KV:
            rope_and_write_kv_kernel[grid, THREADS, st](
                v["qkv"], v["positions"], v["seq_rows"], v["block_tables"], self.cos, self.sin,
                self.kv_pool, i, cfg.num_heads, cfg.num_kv_heads)
        elif op == ATTENTION:
            self.launch_attention(v["qkv"], v["positions"], v["seq_rows"], v["block_tables"], i,
                                  v["attn"], prompt_chunks=t_b > s_b)
        elif op == O_PROJ:
            self.launch_linear(v["attn"], v["rows"], empty, lw.w_o, lw.b_o, v["x"], 1)
        elif op == GATE_UP and self.fuses(SWIGLU, t_b):
            launch_linear_swiglu(v["x"], v["rows"], lw.mlp_norm, self.eps, lw.w_gate_up,
                                 lw.b_gate_up, v["act"], st)
        elif op == GATE_UP:
            self.launch_linear(v["x"], v["rows"], lw.mlp_norm, lw.w_gate_up, lw.b_gate_up,
                               v["gate_up"], 0)
        elif op == SWIGLU:
            swiglu_kernel[grid, THREADS, st](v["gate_up"], v["act"])
        elif op == DOWN:
            self.launch_linear(v["act"], v["rows"], empty, lw.w_down, lw.b_down, v["x"], 1)
        elif op == LM_HEAD:
            self.launch_linear(v["x"], v["logit_rows"], self.final_norm, self.lm_head, empty,
                               v["logits"], 0)
        else:
            sample_rows_kernel[grid, THREADS, st](
                v["logits"], v["temperature"], v["top_p"], v["top_k"], v["seeds"],
                v["counters"], v["tokens"])

    def fuses(self, op: int, t_b: int) -> bool:
        """Whether ``op`` (RoPE, SwiGLU) runs in the epilogue of the GEMV before it in a step of
        T_b tokens (``forward_ops.fused_into_linear``), so that it gets no launch of its own."""
        return self.fuse_epilogues and fused_into_linear(op, t_b, self.tensor_cores)

    def launch_linear(self, x, rows, norm, w, b, out, accumulate) -> None:
        """out (+)= rms_norm?(x[rows]) @ w.T + b (``kernels/linear.py``). A subclass may launch
        another kernel here: the course labs plug a student's GEMV in this way."""
        launch_linear(x, rows, norm, self.eps, w, b, out, accumulate, self.row_scale, self.stream,
                      self.num_sms)

    def launch_attention(self, qkv, positions, seq_rows, block_tables, layer, out,
                         prompt_chunks=False) -> None:
        """Paged attention of layer ``layer`` (``kernels/attention.py``): with its prompt tiles on
        tensor cores where the step may hold a prompt chunk (``prompt_chunks``: the bucket has more
        tokens than sequences) on an fp16 model. A subclass may launch another kernel here (the
        course labs)."""
        H, K = self.config.num_heads, self.config.num_kv_heads
        tiles = uses_attention_tiles(self.tensor_cores, prompt_chunks, H // K, self.config.head_dim)
        attention_kernel(tiles)[op_grid(ATTENTION, qkv.shape[0], 0, self.config, tiles), THREADS,
                                self.stream](
            qkv, positions, seq_rows, block_tables, self.kv_pool, layer, H, K, out,
            self.attn_partials, self.attn_arrivals)

    def run_bucket(self, s_b: int, t_b: int) -> None:
        self.copy_inputs(s_b, t_b)
        self.launch_forward(s_b, t_b)
        self.copy_outputs(s_b, t_b)

    def synchronize(self) -> None:
        if not self.backend.is_simulator:
            self._cupy_stream.synchronize()

    @property
    def compute_stream(self):
        """The CuPy stream every kernel runs on (None in the simulator): KV rotation
        (``kv/rotation.py``) orders its copies against it."""
        return None if self.backend.is_simulator else self._cupy_stream

    def stage_adjustments(self, batch: StepBatch, s_b: int) -> None:
        """The step's logit adjustments on the device, padded to S_b rows (None: no launch).
        Copied per step, not staged in a fixed buffer: their width P varies, and only requests
        that ask for a logit_bias or a penalty pay for them."""
        if batch.adjust_len is None:
            self._adjustments = None
            return
        pad = s_b - batch.num_seqs
        ids = np.pad(batch.adjust_ids, ((0, pad), (0, 0)))  # (S_b, P)
        deltas = np.pad(batch.adjust_deltas, ((0, pad), (0, 0)))  # (S_b, P)
        lengths = np.pad(batch.adjust_len, (0, pad))  # (S_b,)
        self._adjustments = tuple(cuda.to_device(a, stream=self.stream)
                                  for a in (ids, deltas, lengths))

    def step(self, batch: StepBatch) -> np.ndarray:
        """Run one step; (S,) int32 sampled tokens."""
        s_b, t_b = self.buckets(batch.num_seqs, batch.num_tokens)
        self.stage_inputs(batch, s_b, t_b)
        self.stage_adjustments(batch, s_b)
        self.run_bucket(s_b, t_b)
        self.synchronize()
        self.keep_logits(batch)
        return np.array(self.host["tokens"][: batch.num_seqs], dtype=np.int32)

    def keep_logits(self, batch: StepBatch) -> None:
        """``logits_out``: the step's (S, V) logits on the host when a row asked for logprobs
        (one device-to-host copy then; none otherwise)."""
        self.logits_out = None
        if batch.num_logprobs is not None:
            self.logits_out = self.logits[:batch.num_seqs].copy_to_host()


class GraphExecutor(EagerExecutor):
    """Replays one captured CUDA graph per step (input copies + every kernel + output copy)."""

    name = "graph"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.backend.is_simulator:
            raise RuntimeError("the graph executor needs a GPU (CUDA graphs do not exist in "
                               "Numba's simulator); use executor='eager' or 'reference'")
        self.graphs: dict[tuple[int, int], object] = {}
        self.capture_seconds = 0.0

    def capture(self, s_b: int, t_b: int):
        """Capture bucket (S_b, T_b) into a graph (once; kernels are compiled by a warm-up run)."""
        import time

        if (s_b, t_b) not in self.graphs:
            self.run_bucket(s_b, t_b)  # compile every kernel specialisation outside the capture
            self.synchronize()
            start = time.perf_counter()
            self._cupy_stream.begin_capture()
            self.run_bucket(s_b, t_b)
            self.graphs[(s_b, t_b)] = self._cupy_stream.end_capture()
            self.capture_seconds += time.perf_counter() - start
        return self.graphs[(s_b, t_b)]

    def capture_all(self) -> None:
        for s_b, t_b in self.buckets.all_buckets():
            self.stage_padding_only(s_b, t_b)
            self.capture(s_b, t_b)

    def stage_padding_only(self, s_b: int, t_b: int) -> None:
        """Inputs that touch only the scratch block (for capturing before any request exists)."""
        h = self.host
        h["block_tables"][: s_b + 1] = self.scratch_block
        for name in ("token_ids", "positions", "logit_rows", "top_k", "seeds", "counters"):
            h[name][:] = 0
        h["seq_rows"][:] = s_b
        h["temperature"][:] = 0
        h["top_p"][:] = 1

    def step(self, batch: StepBatch) -> np.ndarray:
        if batch.adjust_len is not None:  # the adjustment kernel is in no captured graph
            return super().step(batch)
        s_b, t_b = self.buckets(batch.num_seqs, batch.num_tokens)
        if (s_b, t_b) not in self.graphs:
            self.stage_padding_only(s_b, t_b)
            self.capture(s_b, t_b)
        self.stage_inputs(batch, s_b, t_b)
        self.graphs[(s_b, t_b)].launch(self._cupy_stream)
        self.synchronize()
        self.keep_logits(batch)
        return np.array(self.host["tokens"][: batch.num_seqs], dtype=np.int32)
