"""The persistent executor, host side: set the kernel up, launch it once, stay out of the way.

Blink §3 ("Host loads model + captures CUDA graphs at startup, then exits" the loop) and §7;
docs/design.md §2 (the *persistent* executor). Two dispatchers run a step's forward pass:
``dispatch="inline"`` — inside the one cooperative kernel (``persistent_kernel.py``), or
``dispatch="graph"`` — a one-block scheduler kernel that launches a captured CUDA graph per step
from the GPU (``graph_dispatch.py``, GPU only). This module

1. uploads the weights with every per-layer matrix stacked on a leading layer axis (the kernel
   loops over layers; it cannot receive a Python list of per-layer arrays);
2. allocates the KV pool, the activations (for ``max_num_batched_tokens`` tokens), the flat-batch
   arrays and the scheduler's own state (lanes, block tables, free-block stack);
3. makes the ring visible to the GPU (``ring/placement.py``);
4. launches the kernel — inline: as a cooperative launch of as many blocks as fit on the GPU at
   once (grid barriers need every block resident), on its own non-blocking stream; in Numba's
   simulator with one block, in a background thread, since a simulated launch returns only when
   the kernel does. Graph: captures the forward graphs and the scheduler's own graph, launches it;
5. on ``stop()``: raises the stop flag in host memory that the kernel polls, and waits.

Between ``start()`` and ``stop()`` the host makes no CUDA call: ``stats()`` reads plain host
memory (the control words the kernel publishes with release stores).
"""

from __future__ import annotations

import threading
import time

import numpy as np

from ..backend import get_backend
from ..config import EngineConfig
from ..kernels.attention import attention_scratch
from ..kernels.linear import uses_tensor_cores
from ..kernels.reduce import THREADS, cuda
from ..kernels.sync import clock_handshake
from ..kv.block_manager import blocks_needed
from ..kv.host_store import mapped_host_array
from ..kv.pool import allocate_kv_pool
from ..model.reference import rope_tables
from ..model.weights import ModelWeights
from ..ring.layout import Ring
from ..ring.placement import host_words, map_ring_for_gpu
from ..sched.device_policy import POLICY_CODES
from ..sched.vlt import RotaSchedConfig
from . import persistent_kernel as pk
from .forward_ops import ModelArrays, SamplingHistory, StepBuffers
from .kernel_executor import MATRICES, fused_layer

RING_FIELDS = pk.RingArrays._fields  # the ring fields the kernel reads or writes
# what a request asks of the sampler beyond temperature/top-p/top-k: forward_ops.SamplingHistory
SAMPLING_RING_FIELDS = ("presence_penalty", "frequency_penalty", "logit_bias_ids",
                        "logit_bias_values")


def stacked_weights(weights: ModelWeights, weight_dtype) -> dict[str, object]:
    """Device arrays with a leading layer axis, in the eager executor's fused layouts
    (``fused_layer``): w_qkv (L, (H + 2K) E, D), ..., norms (L, D); absent biases (L, 0)."""
    layers = [fused_layer(lw) for lw in weights.layers]
    out = {}
    for name in layers[0]:
        parts = [layer[name] for layer in layers]
        if parts[0] is None:
            out[name] = cuda.to_device(np.zeros((len(parts), 0), np.float32))
        else:
            dtype = weight_dtype if name in MATRICES else np.float32
            out[name] = cuda.to_device(np.ascontiguousarray(np.stack(parts), dtype=dtype))
    out["embed"] = cuda.to_device(np.ascontiguousarray(weights.embed, weight_dtype))
    out["lm_head"] = (out["embed"] if weights.lm_head is weights.embed
                      else cuda.to_device(np.ascontiguousarray(weights.lm_head, weight_dtype)))
    out["final_norm"] = cuda.to_device(np.ascontiguousarray(weights.final_norm, np.float32))
    return out


def policy_words(policy: str, max_num_seqs: int,
                 config: RotaSchedConfig = RotaSchedConfig()) -> np.ndarray:
    """The kernel's ``policy`` words (persistent_kernel.P_*): the policy's device code and
    RotaSched's parameters, as the host engine's ``make_policy(policy)`` has them."""
    words = np.zeros(pk.NUM_POLICY_WORDS, np.float64)
    words[pk.P_CODE] = POLICY_CODES[policy]
    words[pk.P_ALPHA], words[pk.P_BETA_F], words[pk.P_BETA_B] = (config.alpha, config.beta_f,
                                                                  config.beta_b)
    words[pk.P_TTFT_SLO_S], words[pk.P_TBT_SLO_S] = config.ttft_slo_s, config.tbt_slo_s
    words[pk.P_TRANSFER_BUDGET] = config.transfer_budget_blocks
    words[pk.P_DECISION_INTERVAL] = config.decision_interval
    words[pk.P_MAX_RUNNING] = max_num_seqs
    return words


class PersistentExecutor:
    """The persistent scheduler kernel serving ``ring`` (see the module docstring).
    ``eos_token_ids``: ids that finish a request unless it sets ``ignore_eos``; ``rotasched``:
    the SLOs, transfer budget and decision interval a RotaSched policy decides with (default:
    the paper's, as the host engine's ``make_policy``)."""

    name = "persistent"
    DISPATCHERS = ("inline", "graph")

    def __init__(self, weights: ModelWeights, engine_config: EngineConfig, ring: Ring,
                 eos_token_ids=(), weight_dtype=np.float32, max_model_len: int | None = None,
                 grid_blocks: int | None = None, dispatch: str = "inline",
                 rotasched: RotaSchedConfig | None = None):
        cfg = self.config = weights.config
        self.backend = get_backend()
        if dispatch not in self.DISPATCHERS:
            raise ValueError(f"unknown dispatcher {dispatch!r}: {' or '.join(self.DISPATCHERS)}")
        if dispatch == "graph" and self.backend.is_simulator:
            raise RuntimeError("the device-graph dispatcher needs a GPU (Numba's simulator has no "
                               "CUDA graphs); use dispatch='inline'")
        self.dispatch = dispatch
        self.ring = ring
        self.max_model_len = min(max_model_len or engine_config.max_model_len
                                 or cfg.max_position_embeddings, cfg.max_position_embeddings)
        S, T = engine_config.max_num_seqs, engine_config.max_num_batched_tokens
        if S > T:  # every running request decodes every step: they must all fit the budget
            raise ValueError(f"the persistent executor needs max_num_seqs ({S}) <= "
                             f"max_num_batched_tokens ({T})")
        H, K, E, D, F = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size,
                         cfg.intermediate_size)
        N, B = engine_config.num_kv_blocks, engine_config.block_size
        W = blocks_needed(self.max_model_len, B)  # block-table width
        f32, i32, i64 = np.float32, np.int32, np.int64
        cos, sin = rope_tables(cfg, np.arange(self.max_model_len))  # (P, E/2) each
        self.model = ModelArrays(**stacked_weights(weights, weight_dtype),
                                 no_norm=cuda.to_device(np.zeros(0, f32)),
                                 cos=cuda.to_device(cos), sin=cuda.to_device(sin),
                                 kv_pool=cuda.to_device(allocate_kv_pool(cfg, N, B)),
                                 eps=np.float32(cfg.rms_norm_eps), num_heads=H, num_kv_heads=K,
                                 tensor_cores=uses_tensor_cores(weight_dtype))
        # Lanes: under FCFS one per request in the batch; under a policy also one per request it
        # may keep waiting or rotated out (up to 4 x max_num_seqs, at most the ring's slots)
        self.policy = engine_config.policy
        L = S if self.policy == "fcfs" else max(S, min(ring.layout.num_slots, 4 * S))
        self.num_lanes = L
        lanes = np.zeros((L, pk.NUM_LANE_FIELDS), i64)  # (L, fields)
        lanes[:, pk.L_SLOT] = -1
        self.scheduler_state = pk.SchedulerState(
            lanes=cuda.to_device(lanes),
            lane_sampling=cuda.device_array((L, 2), f32),  # (L, [temperature, top_p])
            lane_stop_ids=cuda.device_array((L, ring.layout.max_stop_ids), i32),  # (L, stops)
            eos_ids=cuda.to_device(np.asarray(list(eos_token_ids) or [-1], i32)),
            block_tables=cuda.to_device(np.full((L, W), -1, i32)),
            free_blocks=cuda.to_device(np.arange(N, dtype=i32)[::-1].copy()),
            free_top=cuda.to_device(np.array([N], i32)),
            sched=cuda.to_device(self._initial_sched()),
            candidates=cuda.device_array(pk.MAX_CANDIDATES, i32),
            policy=cuda.to_device(policy_words(self.policy, S, rotasched or RotaSchedConfig())),
            decide_ints=cuda.device_array((8, L), i32),  # (8, L) the policy's view, answers
            decide_floats=cuda.device_array((4, L), np.float64),  # (4, L) its times, seconds
            mirror_pairs=cuda.device_array((2, pk.MAX_MIRROR_BLOCKS), i32),  # (2, M) GPU, host
            **self._host_arena(engine_config, L, W))
        attn_partials, attn_arrivals = attention_scratch(E)  # attention's splits
        self.step_buffers = StepBuffers(
            x=cuda.device_array((T, D), f32), qkv=cuda.device_array((T, (H + 2 * K) * E), f32),
            attn=cuda.device_array((T, H * E), f32), gate_up=cuda.device_array((T, 2 * F), f32),
            act=cuda.device_array((T, F), f32), logits=cuda.device_array((S, cfg.vocab_size), f32),
            all_rows=cuda.to_device(np.arange(T, dtype=i32)),
            token_ids=cuda.device_array(T, i32), positions=cuda.device_array(T, i32),
            seq_rows=cuda.device_array(T, i32),
            block_tables=self.scheduler_state.block_tables,  # the forward pass reads the lanes'
            logit_rows=cuda.device_array(S, i32),
            step_temperature=cuda.device_array(S, f32), step_top_p=cuda.device_array(S, f32),
            step_top_k=cuda.device_array(S, i32), step_seeds=cuda.device_array(S, np.uint32),
            counters=cuda.device_array(S, i32), tokens=cuda.device_array(S, i32),
            attn_partials=attn_partials, attn_arrivals=attn_arrivals)
        self.row_lane = cuda.device_array(S, i32)  # (R,) each sampled row's lane
        self.num_kv_blocks = N
        self.control = host_words(pk.NUM_CONTROL_WORDS)  # (C,) int64 host memory the GPU sees
        self.ring_mapping = map_ring_for_gpu(ring, RING_FIELDS + SAMPLING_RING_FIELDS)
        self.budget = T
        self.grid_blocks = grid_blocks
        self._thread: threading.Thread | None = None
        self._stream = None
        self._graphs = None  # graph dispatch: the ForwardGraphs and the scheduler's own graph
        self.error: BaseException | None = None

    def _host_arena(self, engine_config: EngineConfig, S: int, W: int) -> dict:
        """SchedulerState's rotation arrays: the KV pool seen as one row a block, the host arena
        (pinned host memory mapped into the GPU: ``num_host_kv_blocks`` rows, 2 x the pool's by
        default, with ``preemption="rotate"``; else an empty free stack, and the kernel preempts
        by recompute), each lane's host blocks and the arena's free stack."""
        pool = self.model.kv_pool  # (N, L, 2, B, K, E)
        N, words = pool.shape[0], int(np.prod(pool.shape[1:]))
        rotates = engine_config.preemption == "rotate"
        NH = (engine_config.num_host_kv_blocks or 2 * N) if rotates else 0
        self._host_kv, host_kv = mapped_host_array((max(NH, 1), words), pool.dtype)  # (NH, words)
        self.num_host_kv_blocks = NH
        self.kv_block_nbytes = words * pool.dtype.itemsize  # what one rotated block moves
        i32 = np.int32
        return dict(kv_blocks=pool.reshape(N, words), host_kv=host_kv,
                    host_tables=cuda.to_device(np.full((S, W), -1, i32)),
                    host_free_blocks=cuda.to_device(np.arange(NH, dtype=i32)[::-1].copy()),
                    host_free_top=cuda.to_device(np.array([NH], i32)))

    def _initial_sched(self) -> np.ndarray:
        sched = np.zeros(pk.NUM_SCHED_WORDS, np.int64)
        sched[pk.S_CLOCK_OFFSET] = self._clock_offset_ns()
        return sched

    def _clock_offset_ns(self, rounds: int = 9) -> int:
        """host ``time.monotonic_ns()`` minus the GPU's ``%globaltimer``, so that the kernel's
        timestamps in the ring are on the frontend's clock. A handshake through mapped host memory
        (``clock_handshake``): the GPU reads its clock between the host's go and the host seeing
        it done, a PCIe round trip (a few µs) — not between a launch and a copy back, which are
        tens of µs apart and lopsided. The tightest of ``rounds`` brackets wins."""
        if self.backend.is_simulator:
            return 0  # the simulator's GPU clock is time.monotonic_ns itself
        words = host_words(3)  # (go, GPU clock, done), mapped host memory
        best = None
        for _ in range(rounds + 1):  # the first round compiles the kernel: not counted
            words.host[:] = 0
            clock_handshake[1, 1](words.device)
            time.sleep(200e-6)  # let the kernel start spinning
            before = time.monotonic_ns()
            words.host[0] = 1
            deadline = time.monotonic() + 10
            while words.host[2] == 0:
                if time.monotonic() > deadline:
                    raise TimeoutError("the GPU did not answer the clock handshake")
            after = time.monotonic_ns()
            cuda.synchronize()
            if best is None or after - before < best[0]:
                best = (after - before, (before + after) // 2 - int(words.host[1]))
        return best[1]

    # --- launch and stop -------------------------------------------------------------------
    def _sampling_history(self) -> SamplingHistory:
        views = self.ring_mapping.views
        return SamplingHistory(self.row_lane, self.scheduler_state.lanes,
                               *[views[name] for name in SAMPLING_RING_FIELDS],
                               views["output_tokens"])

    def _ring_arrays(self) -> pk.RingArrays:
        return pk.RingArrays(*[self.ring_mapping.views[name] for name in RING_FIELDS])

    def _args(self) -> tuple:
        """The inline kernel's arguments: its named groups, then three numbers."""
        return (self._ring_arrays(), self.control.device, self.model, self.step_buffers,
                self.scheduler_state, self._sampling_history(), self.budget, self.max_model_len,
                int(self.ring_mapping.in_device_memory))

    def start(self) -> None:
        """Launch the kernel; it runs until ``stop()``."""
        if self._thread is not None or self._stream is not None:
            raise RuntimeError("the persistent kernel is already running")
        self.control.host[:] = 0
        self.control.host[pk.C_FREE_BLOCKS] = self.num_kv_blocks  # until the kernel's first step
        self.control.host[pk.C_HOST_FREE_BLOCKS] = self.num_host_kv_blocks
        args = self._args()
        if self.backend.is_simulator:  # one block; the launch blocks, so it gets a thread
            self._thread = threading.Thread(target=self._run_simulated, args=(args,),
                                            name="persistent-kernel", daemon=True)
            self._thread.start()
            return
        import cupy

        self._stream = cupy.cuda.Stream(non_blocking=True)  # never the legacy default stream
        if self.dispatch == "graph":
            self._start_graph_dispatch()
            return
        kernel = pk.persistent_scheduler_kernel
        compiled = kernel.compile(tuple(kernel.typeof_pyval(a) for a in args))
        fitting = compiled.max_cooperative_grid_blocks(THREADS)
        sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
        self.grid_blocks = min(self.grid_blocks or sms, fitting)
        kernel[self.grid_blocks, THREADS, cuda.external_stream(self._stream.ptr)](*args)

    def _start_graph_dispatch(self) -> None:
        """Capture the forward graphs, then the one-block scheduler kernel's launch as a graph of
        its own (device launches must come from a kernel in a graph), and launch that."""
        from . import graph_dispatch as gd

        forward = gd.ForwardGraphs(self.model, self.step_buffers, self._sampling_history(),
                                   self.config, self.budget, self.step_buffers.logits.shape[0],
                                   self._stream.ptr)
        args = (self._ring_arrays(), self.control.device, self.step_buffers,
                self.scheduler_state, self.row_lane, forward.sizes, forward.done, forward.execs,
                forward.bucket_tokens, self.config.vocab_size, self.model.kv_pool.shape[3],
                self.budget, self.max_model_len, int(self.ring_mapping.in_device_memory))
        kernel = gd.graph_dispatch_scheduler_kernel
        kernel.compile(tuple(kernel.typeof_pyval(a) for a in args))  # not inside the capture
        stream = cuda.external_stream(self._stream.ptr)
        scheduler = gd.capture_device_graph(self._stream.ptr,
                                            lambda: kernel[1, THREADS, stream](*args))
        self._graphs = (forward, scheduler)
        self.grid_blocks = 1
        gd.launch_graph(scheduler[1], self._stream.ptr)

    def _run_simulated(self, args) -> None:
        try:
            pk.persistent_scheduler_kernel[1, THREADS](*args)
        except BaseException as err:  # noqa: BLE001 - surfaced by stop() and alive()
            self.error = err

    def alive(self) -> bool:
        """Whether the kernel is still running (the simulator's thread, or the GPU stream)."""
        if self._thread is not None:
            return self._thread.is_alive()
        return self._stream is not None and not self._stream.done

    def stop(self, timeout_s: float = 60.0) -> None:
        """Raise the stop flag and wait for the kernel to return."""
        self.control.host[pk.C_STOP] = 1
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                raise TimeoutError("the persistent kernel did not stop")
            self._thread = None
        elif self._stream is not None:
            deadline = time.monotonic() + timeout_s
            while not self._stream.done:
                if time.monotonic() > deadline:
                    raise TimeoutError("the persistent kernel did not stop")
                time.sleep(1e-3)
            self._stream.synchronize()  # raises if the kernel faulted
            self._stream = None
            self._destroy_graphs()
            self.ring_mapping.release()
        error = int(self.control.host[pk.C_DISPATCH_ERROR])
        if error:
            raise RuntimeError(f"the scheduler kernel's device-side graph launch failed: "
                               f"cudaError_t {error}")
        if self.error is not None:
            raise RuntimeError("the persistent kernel failed") from self.error

    def stats(self) -> dict[str, int]:
        """The kernel's counters, read from host memory (no CUDA call)."""
        c = self.control.host
        return dict(steps=int(c[pk.C_STEPS]), heartbeat=int(self.ring.engine_heartbeat),
                    claimed=int(c[pk.C_CLAIMED]), last_scan_ns=int(c[pk.C_SCAN_NS]),
                    scans=int(c[pk.C_SCANS]), running=int(c[pk.C_RUNNING]),
                    free_blocks=int(c[pk.C_FREE_BLOCKS]), schedule_ns=int(c[pk.C_SCHEDULE_NS]),
                    forward_ns=int(c[pk.C_FORWARD_NS]), publish_ns=int(c[pk.C_PUBLISH_NS]),
                    relaunches=int(c[pk.C_RELAUNCHES]), dispatch_error=int(c[pk.C_DISPATCH_ERROR]),
                    preemptions=int(c[pk.C_PREEMPTIONS]), rotations=int(c[pk.C_ROTATIONS]),
                    rotate_ins=int(c[pk.C_ROTATE_INS]),
                    host_free_blocks=int(c[pk.C_HOST_FREE_BLOCKS]), waiting=int(c[pk.C_WAITING]),
                    decisions=int(c[pk.C_DECISIONS]), blocks_out=int(c[pk.C_BLOCKS_OUT]),
                    blocks_in=int(c[pk.C_BLOCKS_IN]),
                    blocks_mirrored=int(c[pk.C_BLOCKS_MIRRORED]))

    def _destroy_graphs(self) -> None:
        if self._graphs is not None:
            from .graph_dispatch import destroy_graphs

            forward, scheduler = self._graphs
            forward.destroy()
            destroy_graphs([scheduler])
            self._graphs = None
