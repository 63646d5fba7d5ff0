"""Lab 2 — the ring. The host CAS against the state machine, inside the real ring and engine loop;
the device claim in a race of many threads; the publish order; and both inside a persistent
polling kernel serving frontend threads (``python -m blink_edu.labs check 2``)."""

from __future__ import annotations

import threading
from contextlib import contextmanager

import numpy as np
import pytest

from blink_edu import labs
from blink_edu.backend import get_backend
from blink_edu.config import SamplingParams
from blink_edu.kernels.reduce import cuda
from blink_edu.labs.checks import check_equal, check_tokens
from blink_edu.labs.plug import lab2
from blink_edu.model import reference
from blink_edu.ring.layout import (DECODE_COMPLETED, DECODE_PAUSED, DECODE_PROCESSING, EMPTY,
                                   FILLING, FINISH_LENGTH, PREFILL_PENDING, PREFILL_PROCESSING,
                                   STATE_NAMES, TRANSITIONS)

pytestmark = pytest.mark.lab2
ALL_STATES = sorted(STATE_NAMES)


def slot_cas(ring, slot, expected, new):
    impl = labs.implementation(2)
    labs.require(impl.slot_cas, "2.1")
    return impl.slot_cas(ring, slot, expected, new)


# --- 2.1 ------------------------------------------------------------------------------------------
@pytest.mark.task("2.1")
def test_cas_moves_only_from_the_expected_state():
    ring = lab2.new_lab_ring()
    check_equal(slot_cas(ring, 3, EMPTY, FILLING), True, "slot_cas(slot 3, EMPTY -> FILLING)")
    check_equal(STATE_NAMES[int(ring.state[3])], "FILLING", "slot 3 after it")
    check_equal(slot_cas(ring, 3, EMPTY, FILLING), False,
                "slot_cas(slot 3, EMPTY -> FILLING) again (it is FILLING now)")
    check_equal(STATE_NAMES[int(ring.state[3])], "FILLING", "slot 3 after a CAS that lost")
    check_equal(slot_cas(ring, 3, FILLING, PREFILL_PENDING), True,
                "slot_cas(slot 3, FILLING -> PREFILL_PENDING)")
    check_equal(STATE_NAMES[int(ring.state[3])], "PREFILL_PENDING", "slot 3 after it")
    check_equal(np.delete(ring.state, 3), np.full(ring.layout.num_slots - 1, EMPTY),
                "every other slot (only the named slot may change; EMPTY=0)")


@pytest.mark.task("2.1")
def test_cas_rejects_every_move_the_state_machine_does_not_have():
    ring = lab2.new_lab_ring()
    for old in ALL_STATES:
        for new in ALL_STATES:
            if (old, new) in TRANSITIONS:
                continue
            ring.state[0] = old
            with pytest.raises(ValueError):
                slot_cas(ring, 0, old, new)
            assert ring.state[0] == old, f"an illegal {STATE_NAMES[old]} -> {STATE_NAMES[new]}"


class SpyRing(lab2.LabRing):
    """Records, for every read and write of a state word, whether the ring's lock was held."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.held = False
        self.accesses: list[bool] = []
        spy = self

        class Watched(np.ndarray):
            def __getitem__(self, i):
                spy.accesses.append(spy.held)
                return super().__getitem__(i)

            def __setitem__(self, i, v):
                spy.accesses.append(spy.held)
                super().__setitem__(i, v)

        self.state = self.state.view(Watched)

    @contextmanager
    def lock(self):
        with super().lock():
            self.held = True
            try:
                yield
            finally:
                self.held = False


@pytest.mark.task("2.1")
def test_cas_reads_and_writes_the_state_under_the_lock():
    ring = SpyRing(bytearray(lab2.LAYOUT.nbytes), lab2.LAYOUT)
    slot_cas(ring, 1, EMPTY, FILLING)
    slot_cas(ring, 1, EMPTY, FILLING)
    assert ring.accesses and all(ring.accesses), \
        "the state word was read or written without holding ring.lock()"


@pytest.mark.task("2.1")
def test_racing_frontends_reserve_each_slot_once():
    ring = lab2.new_lab_ring()
    wins: list[tuple[int, int]] = []
    start = threading.Barrier(4)

    def frontend(k):
        start.wait()
        for slot in range(ring.layout.num_slots):
            if slot_cas(ring, slot, EMPTY, FILLING):
                wins.append((k, slot))

    threads = [threading.Thread(target=frontend, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check_equal(sorted(s for _, s in wins), list(range(ring.layout.num_slots)),
                "slots won by the four racing threads, sorted (each exactly once)")


@pytest.mark.task("2.1")
def test_the_ring_loop_serves_requests_through_your_cas(rng):
    weights = lab2.micro_weights(seed=int(rng.integers(1000)))
    prompts = [rng.integers(3, 64, size=int(n)).tolist() for n in rng.integers(1, 7, size=5)]
    greedy = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    got, ring = lab2.serve_through_ring_loop(weights, prompts, greedy, timeout_s=60)
    want = reference.generate(weights, prompts, greedy, block_size=lab2.ENGINE.block_size)
    check_tokens(got, want, "tokens served through the ring loop with your slot_cas")
    assert (ring.state == EMPTY).all(), "every slot must be EMPTY again after release"


# --- 2.2 ------------------------------------------------------------------------------------------
@pytest.mark.task("2.2")
def test_claim_takes_only_pending_slots():
    states = np.array([EMPTY, FILLING, PREFILL_PENDING, PREFILL_PROCESSING, DECODE_PROCESSING,
                       DECODE_COMPLETED, DECODE_PAUSED, PREFILL_PENDING], np.int32)
    after, winners = lab2.race_to_claim(states, rounds=1)
    expected = np.where(states == PREFILL_PENDING, PREFILL_PROCESSING, states)
    check_equal([STATE_NAMES[int(v)] for v in after], [STATE_NAMES[int(v)] for v in expected],
                "the slots' states after one claim round")
    check_equal(winners, (states == PREFILL_PENDING).astype(np.int32), "claims won per slot")


@pytest.mark.task("2.2")
def test_racing_threads_claim_each_slot_exactly_once():
    states = np.full(8, PREFILL_PENDING, np.int32)
    after, winners = lab2.race_to_claim(states, rounds=2)
    check_equal(after, np.full(8, PREFILL_PROCESSING), "states after the race (all claimed)")
    assert winners.tolist() == [1] * 8, (
        f"claims per slot {winners.tolist()}: a slot claimed more than once means two threads "
        f"both saw PREFILL_PENDING — the check and the write must be one atomic CAS")


# --- 2.3 ------------------------------------------------------------------------------------------
class LoggedWrites(np.ndarray):
    """An array logging every write (a shared, ordered log), for the publish-order test."""

    def __setitem__(self, index, value):
        self.log.append((self.field, index if isinstance(index, tuple) else (index,), int(value)))
        super().__setitem__(index, value)

    def __array_finalize__(self, obj):
        self.log = getattr(obj, "log", None)
        self.field = getattr(obj, "field", None)


_PUBLISH: dict = {}


def publish_all(impl, state, output_tokens, generated, finish_reason, slot, tokens):
    fn = impl.publish_token
    if fn not in _PUBLISH:
        @cuda.jit
        def kernel(state, output_tokens, generated, finish_reason, slot, tokens):
            if cuda.grid(1) == 0:
                for i in range(tokens.shape[0]):
                    fn(state, output_tokens, generated, finish_reason, slot, tokens[i],
                       1 if i == tokens.shape[0] - 1 else 0)

        _PUBLISH[fn] = kernel
    _PUBLISH[fn][1, 1](state, output_tokens, generated, finish_reason, slot, tokens)


@pytest.mark.task("2.3")
def test_publish_writes_tokens_counter_state_and_reason(rng):
    impl = labs.implementation(2)
    labs.require(impl.publish_token, "2.3")
    S, O, slot = 4, 6, int(rng.integers(4))
    tokens = rng.integers(3, 100, size=4).astype(np.int32)
    state = np.full(S, DECODE_PROCESSING, np.int32)
    state[slot] = PREFILL_PROCESSING
    out = np.full((S, O), -1, np.int32)
    gen, reason = np.zeros(S, np.int32), np.zeros(S, np.int32)
    d = [cuda.to_device(a) for a in (state, out, gen, reason)]
    publish_all(impl, *d, slot, cuda.to_device(tokens))
    state, out, gen, reason = (a.copy_to_host() for a in d)
    check_equal(out[slot].tolist(), tokens.tolist() + [-1] * (O - 4),
                "the slot's output tokens (the rest untouched: -1)")
    check_equal(int(gen[slot]), 4, "the slot's generated counter")
    check_equal(STATE_NAMES[int(state[slot])], "DECODE_COMPLETED", "the slot's state")
    check_equal(int(reason[slot]), FINISH_LENGTH, f"the slot's finish reason (FINISH_LENGTH="
                                                  f"{FINISH_LENGTH})")
    others = [s for s in range(S) if s != slot]
    check_equal(gen[others], np.zeros(S - 1, np.int32), "the other slots' counters")
    check_equal(out[others], np.full((S - 1, O), -1, np.int32), "the other slots' tokens")


@pytest.mark.task("2.3")
def test_publish_order_token_before_counter_before_state(rng):
    if not get_backend().is_simulator:
        pytest.skip("the order of plain stores is observed only in the simulator")
    from blink_edu.ring.placement import _simulated_view

    impl = labs.implementation(2)
    labs.require(impl.publish_token, "2.3")
    log: list = []
    arrays = {}
    for field, init in (("state", np.full(2, PREFILL_PROCESSING, np.int32)),
                        ("output_tokens", np.full((2, 4), -1, np.int32)),
                        ("generated", np.zeros(2, np.int32)),
                        ("finish_reason", np.zeros(2, np.int32))):
        a = init.view(LoggedWrites)
        a.log, a.field = log, field
        arrays[field] = a
    tokens = rng.integers(3, 100, size=3).astype(np.int32)
    publish_all(impl, *(_simulated_view(arrays[f]) for f in
                        ("state", "output_tokens", "generated", "finish_reason")), 1,
                cuda.to_device(tokens))
    order = [(f, v) for f, _, v in log]
    expected = []
    for n, token in enumerate(tokens.tolist()):
        expected += [("output_tokens", token), ("generated", n + 1)]
        if n == 0:
            expected.append(("state", DECODE_PROCESSING))
    expected += [("finish_reason", FINISH_LENGTH), ("state", DECODE_COMPLETED)]
    assert order == expected, f"writes in this order: {order}"


# --- 2.2 + 2.3 inside the persistent polling kernel ---------------------------------------------
@pytest.mark.task("2.2")
@pytest.mark.task("2.3")
def test_the_polling_kernel_serves_frontend_threads(rng):
    requests = [(rng.integers(3, 100, size=int(rng.integers(1, 6))).tolist(),
                 int(rng.integers(1, 6))) for _ in range(10)]
    tokens, claims, submitted = lab2.serve_with_polling_kernel(requests, n_frontends=3,
                                                               timeout_s=60)
    check_tokens(tokens, [lab2.toy_tokens(p, m) for p, m in requests],
                 "tokens the polling kernel served")
    assert claims.tolist() == submitted.tolist(), "every submission claimed exactly once"
