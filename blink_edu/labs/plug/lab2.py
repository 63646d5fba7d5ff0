"""Lab 2's plug: the lab's CAS inside a real ring, and the lab's claim/publish inside a
persistent polling kernel.

* ``LabRing`` is ``ring.layout.Ring`` whose ``cas`` is the lab's ``slot_cas``: the frontend
  (``RingClient``) and the engine's host loop (``RingEngineLoop`` over ``LLMEngine`` with the
  NumPy reference executor) move every slot through it. ``serve_through_ring_loop`` runs them.
* ``make_polling_kernel`` builds a persistent kernel around the lab's ``claim_slot`` and
  ``publish_token``: every thread scans every slot and all race to claim each pending one; the
  winner serves it with a toy model (``toy_tokens``: the prompt backwards, cycling) and publishes
  token by token. ``PollingService`` launches it (in the simulator: one block, in a thread, since
  a simulated launch returns only when the kernel does) over a ring the frontend fills.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import numpy as np

from .. import implementation, require
from ...backend import get_backend
from ...config import EngineConfig, ModelConfig, SamplingParams
from ...engine.llm_engine import LLMEngine
from ...engine.ring_loop import RingEngineLoop
from ...kernels.reduce import cuda
from ...kernels.sync import load_acquire, pause_ns
from ...model.weights import random_weights
from ...ring.client import RingClient
from ...ring.layout import EMPTY, PREFILL_PENDING, Ring, RingLayout
from ...ring.placement import host_words, map_ring_for_gpu

LAYOUT = RingLayout(num_slots=8, max_prompt_tokens=16, max_output_tokens=8)
MICRO = dict(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=48,
             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
             max_position_embeddings=64, rope_theta=10000.0, rms_norm_eps=1e-5,
             tie_word_embeddings=True, eos_token_id=2)
ENGINE = EngineConfig(executor="reference", block_size=4, num_kv_blocks=16, max_num_seqs=3,
                      max_num_batched_tokens=8, max_model_len=32)
# Simulated threads are Python threads: a few racing claimers are plenty. On a GPU: one warp.
POLL_THREADS = 8 if get_backend().is_simulator else 32
POLL_FIELDS = ("state", "prompt_len", "prompt_tokens", "max_tokens", "output_tokens", "generated",
               "finish_reason")
C_STOP, C_SCANS = 0, 1


def micro_weights(seed: int = 0):
    return random_weights(ModelConfig.from_dict(MICRO), seed=seed, scale=0.4)


# --- 2.1 inside the real ring -------------------------------------------------------------------
class LabRing(Ring):
    """A ring whose every state change is the lab's ``slot_cas``."""

    def cas(self, slot: int, expected: int, new: int) -> bool:
        impl = implementation(2)
        require(impl.slot_cas, "2.1")
        return bool(impl.slot_cas(self, slot, expected, new))


def new_lab_ring(layout: RingLayout = LAYOUT) -> LabRing:
    return LabRing(bytearray(layout.nbytes), layout)


def serve_through_ring_loop(weights, prompts, params: SamplingParams, timeout_s: float = 60,
                            n_frontends: int = 2) -> tuple[list[list[int]], LabRing]:
    """Serve ``prompts`` through a ``LabRing``: frontend threads submit and poll with
    ``RingClient``, the host ``RingEngineLoop`` claims and runs them on ``LLMEngine``. Returns the
    tokens per prompt and the ring (every slot EMPTY again)."""
    ring = new_lab_ring()
    loop = RingEngineLoop(ring, LLMEngine(weights, ENGINE))
    stop = threading.Event()
    engine_thread = threading.Thread(target=loop.run, args=(stop,), name="lab2-engine", daemon=True)
    engine_thread.start()
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def frontend(mine):
        try:
            client = RingClient(ring)
            for i in mine:
                slot = client.submit(prompts[i], params, request_id=i)
                results[i] = client.collect([slot], timeout_s)[slot][0]
        except BaseException as err:  # noqa: BLE001 - re-raised below
            errors.append(err)

    threads = [threading.Thread(target=frontend, args=(list(range(k, len(prompts), n_frontends)),))
               for k in range(n_frontends)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout_s)
    finally:
        stop.set()
        engine_thread.join(timeout_s)
    if errors:
        raise errors[0]
    return [results[i] for i in range(len(prompts))], ring


# --- 2.2 and 2.3 inside a persistent polling kernel ---------------------------------------------
def toy_tokens(prompt: list[int], max_tokens: int) -> list[int]:
    """What the polling kernel's toy model answers: the prompt backwards, cycling."""
    n = len(prompt)
    return [prompt[n - 1 - (i % n)] for i in range(max_tokens)]


_KERNELS: dict = {}


def make_polling_kernel(claim_slot, publish_token):
    """A persistent kernel around these two device functions (cached per pair)."""
    key = (claim_slot, publish_token)
    if key in _KERNELS:
        return _KERNELS[key]

    @cuda.jit
    def polling_kernel(state, prompt_len, prompt_tokens, max_tokens, output_tokens, generated,
                       finish_reason, control, claims):
        tid = cuda.threadIdx.x
        while load_acquire(control, C_STOP) == 0:
            served = 0
            for slot in range(state.shape[0]):  # every thread scans every slot: they race
                if load_acquire(state, slot) == PREFILL_PENDING and claim_slot(state, slot):
                    cuda.atomic.add(claims, slot, 1)  # device memory: counts winners per slot
                    n, m = prompt_len[slot], max_tokens[slot]
                    for i in range(m):
                        token = prompt_tokens[slot, n - 1 - (i % n)]
                        publish_token(state, output_tokens, generated, finish_reason, slot,
                                      token, 1 if i == m - 1 else 0)
                    served += 1
            if tid == 0:
                cuda.atomic.add(control, C_SCANS, 1)
            if served == 0:
                pause_ns(20000)

    _KERNELS[key] = polling_kernel
    return polling_kernel


class PollingService:
    """The polling kernel serving ``ring`` until ``stop()``; ``claims()`` counts, per slot, how
    many times a thread won a claim (once per request submitted to that slot)."""

    def __init__(self, ring: Ring, impl=None):
        impl = impl or implementation(2)
        require(impl.claim_slot, "2.2")
        require(impl.publish_token, "2.3")
        self.kernel = make_polling_kernel(impl.claim_slot, impl.publish_token)
        self.ring = ring
        self.mapping = map_ring_for_gpu(ring, POLL_FIELDS)
        self.control = host_words(2)
        self.claims_device = cuda.to_device(np.zeros(ring.layout.num_slots, np.int32))
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def _args(self):
        return (*[self.mapping.views[name] for name in POLL_FIELDS], self.control.device,
                self.claims_device)

    def start(self) -> None:
        if get_backend().is_simulator:
            self._thread = threading.Thread(target=self._run, name="lab2-polling-kernel",
                                            daemon=True)
            self._thread.start()
        else:  # one block of one warp on its own stream; the host makes no CUDA call until stop
            import cupy

            self._stream = cupy.cuda.Stream(non_blocking=True)
            self.kernel[1, POLL_THREADS, cuda.external_stream(self._stream.ptr)](*self._args())

    def _run(self) -> None:
        try:
            self.kernel[1, POLL_THREADS](*self._args())
        except BaseException as err:  # noqa: BLE001 - surfaced by stop()
            self.error = err

    def scans(self) -> int:
        return int(self.control.host[C_SCANS])

    def stop(self, timeout_s: float = 30) -> None:
        self.control.host[C_STOP] = 1
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                raise TimeoutError("the polling kernel did not stop")
        else:
            self._stream.synchronize()
        if self.error is not None:
            raise self.error

    def claims(self) -> np.ndarray:
        return self.claims_device.copy_to_host()


@contextmanager
def polling_service(ring: Ring):
    service = PollingService(ring)
    service.start()
    try:
        yield service
    finally:
        service.stop()


def serve_with_polling_kernel(requests: list[tuple[list[int], int]], n_frontends: int = 2,
                              timeout_s: float = 60, ring: Ring | None = None):
    """Frontend threads submit ``(prompt, max_tokens)`` requests through ``RingClient`` and poll
    while the polling kernel serves them. Returns (tokens per request, claims per slot, ring)."""
    ring = ring if ring is not None else Ring(bytearray(LAYOUT.nbytes), LAYOUT)
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []
    submitted = np.zeros(ring.layout.num_slots, np.int32)

    def frontend(mine):
        try:
            client = RingClient(ring)
            for i in mine:
                prompt, max_tokens = requests[i]
                slot = client.submit(prompt, SamplingParams(max_tokens=max_tokens), request_id=i)
                submitted[slot] += 1
                results[i] = client.collect([slot], timeout_s)[slot][0]
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    with polling_service(ring) as service:
        threads = [threading.Thread(target=frontend,
                                    args=(list(range(k, len(requests), n_frontends)),))
                   for k in range(n_frontends)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout_s)
    if errors:
        raise errors[0]
    assert (ring.state == EMPTY).all()
    return [results[i] for i in range(len(requests))], service.claims(), submitted


class YieldingReads(np.ndarray):
    """An array whose every element read lets other (simulated) threads run."""

    def __getitem__(self, index):
        value = super().__getitem__(index)
        time.sleep(1e-4)
        return value


# --- a one-shot race, for the tests ---------------------------------------------------------------
_RACES: dict = {}


def race_to_claim(states: np.ndarray, rounds: int = 4, impl=None) -> tuple[np.ndarray, np.ndarray]:
    """Every thread of one block tries to claim every slot of ``states`` (rounds times over, a
    tiny pause between tries so that threads interleave); returns (states after, winners per
    slot). A correct claim: exactly one winner per PREFILL_PENDING slot, none elsewhere."""
    impl = impl or implementation(2)
    require(impl.claim_slot, "2.2")
    claim_slot = impl.claim_slot
    if claim_slot not in _RACES:
        @cuda.jit
        def race(state, winners, rounds):
            for _ in range(rounds):
                for slot in range(state.shape[0]):
                    if claim_slot(state, slot):
                        cuda.atomic.add(winners, slot, 1)
                    pause_ns(1000)

        _RACES[claim_slot] = race
    if get_backend().is_simulator:
        # Simulated threads rarely switch between a load and a store; a read that yields makes
        # them interleave there, as GPU threads do — so a claim that is not one atomic step
        # shows up as a slot won twice. (Inside the simulator's atomic CAS the read holds its
        # lock, so a real CAS stays atomic.)
        from ...ring.placement import _simulated_view

        state = _simulated_view(np.array(states, np.int32).view(YieldingReads))  # a copy
    else:
        state = cuda.to_device(np.array(states, np.int32))
    winners = cuda.to_device(np.zeros(len(states), np.int32))
    _RACES[claim_slot][1, POLL_THREADS](state, winners, rounds)
    return np.asarray(state.copy_to_host()), winners.copy_to_host()
