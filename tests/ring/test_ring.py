"""The ring's layout, its state machine and the frontend client, without an engine: every state
change goes through ``cas``; a full ring says so; the client checks sizes; slots are never handed
to two frontends, threads or processes; another process sees the ring by name."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from blink_edu.config import SamplingParams
from blink_edu.ring import (DECODE_COMPLETED, DECODE_PAUSED, DECODE_PROCESSING, EMPTY, FILLING,
                            FINISH_CODES, PREFILL_PENDING, PREFILL_PROCESSING, STATE_NAMES,
                            TRANSITIONS, Ring, RingClient, RingFull, RingLayout)
from blink_edu.ring.layout import ALIGN

SMALL = RingLayout(num_slots=5, max_prompt_tokens=16, max_output_tokens=8, max_stop_ids=2)


@pytest.fixture
def shm_ring():
    ring = Ring.create(SMALL)
    yield ring
    ring.close()
    ring.unlink()


def local_ring(layout: RingLayout = SMALL) -> Ring:
    """A ring over a plain NumPy array (one process; the GPU version passes a mapped array)."""
    return Ring(np.ones(layout.nbytes + 100, dtype=np.uint8), layout)


def complete(ring: Ring, slot: int, tokens: list[int], reason: str) -> None:
    """Play the engine for one slot: claim, publish ``tokens``, finish with ``reason``."""
    assert ring.cas(slot, PREFILL_PENDING, PREFILL_PROCESSING)
    for i, t in enumerate(tokens):
        ring.output_tokens[slot, i] = t
        ring.generated[slot] = i + 1
    assert ring.cas(slot, PREFILL_PROCESSING, DECODE_PROCESSING)
    ring.finish_reason[slot] = FINISH_CODES[reason]
    assert ring.cas(slot, DECODE_PROCESSING, DECODE_COMPLETED)


def test_fields_are_aligned_disjoint_and_inside_the_buffer():
    layout = RingLayout()  # the default 4096 slots
    spans = sorted((f.offset, f.offset + f.nbytes) for f in layout.fields.values())
    assert all(start % ALIGN == 0 for start, _ in spans)
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:]))
    assert spans[-1][1] <= layout.nbytes
    ring = local_ring(layout)
    assert ring.state.shape == (4096,) and ring.state.dtype == np.int32
    assert ring.prompt_tokens.shape == (4096, layout.max_prompt_tokens)
    assert ring.stop_ids.shape == (4096, 4) and ring.temperature.dtype == np.float32
    assert (ring.state == EMPTY).all() and int(ring.doorbell) == 0  # formatting zeroed the ones
    with pytest.raises(ValueError, match="too small"):
        Ring(np.zeros(layout.nbytes - 1, dtype=np.uint8), layout)
    with pytest.raises(ValueError, match="writable"):
        Ring(bytes(layout.nbytes), layout)
    with pytest.raises(ValueError, match="bad magic"):
        Ring(np.zeros(layout.nbytes, dtype=np.uint8))


def test_cas_follows_the_state_machine_and_nothing_else():
    ring = local_ring()
    path = [EMPTY, FILLING, PREFILL_PENDING, PREFILL_PROCESSING, DECODE_PROCESSING, DECODE_PAUSED,
            DECODE_PROCESSING, DECODE_COMPLETED, EMPTY]
    for old, new in zip(path, path[1:]):
        assert ring.cas(3, old, new) and ring.state[3] == new
        assert not ring.cas(3, old, new)  # the same move twice: only the first wins
        assert ring.state[3] == new
    assert (ring.state == EMPTY).all()
    assert ring.cas(3, EMPTY, FILLING)  # a stale expectation changes nothing:
    assert not ring.cas(3, PREFILL_PENDING, PREFILL_PROCESSING) and ring.state[3] == FILLING
    for old in STATE_NAMES:
        for new in STATE_NAMES:
            if (old, new) not in TRANSITIONS:
                with pytest.raises(ValueError, match="no transition"):
                    ring.cas(0, old, new)
    with pytest.raises(RuntimeError, match="did not own"):
        ring.advance(0, DECODE_PROCESSING, DECODE_COMPLETED)


def test_full_ring_raises_and_a_released_slot_is_reused(shm_ring):
    client = RingClient(shm_ring)
    params = SamplingParams(temperature=0, max_tokens=3)
    slots = [client.submit([7, 8], params, request_id=i) for i in range(SMALL.num_slots)]
    assert sorted(slots) == list(range(SMALL.num_slots))
    assert int(shm_ring.doorbell) == SMALL.num_slots
    with pytest.raises(RingFull):
        client.submit([1], params, request_id=99)
    assert client.occupancy()["PREFILL_PENDING"] == SMALL.num_slots  # nothing was dropped
    with pytest.raises(ValueError, match="only a DECODE_COMPLETED slot"):
        client.release(slots[2])
    complete(shm_ring, slots[2], [5, 6, 7], "length")
    assert client.poll(slots[2], 0) == ([5, 6, 7], True, "length")
    assert client.poll(slots[2], 2) == ([7], True, "length")
    client.release(slots[2])
    with pytest.raises(ValueError, match="EMPTY: no request"):
        client.poll(slots[2], 0)
    again = client.submit([9, 9, 9], params, request_id=100)
    assert again == slots[2]
    assert shm_ring.generated[again] == 0 and shm_ring.finish_reason[again] == 0  # fresh
    assert client.poll(again, 0) == ([], False, None)


def test_submit_writes_the_payload_and_validates_sizes(shm_ring, rng):
    client = RingClient(shm_ring)
    prompt = rng.integers(0, 1000, size=int(rng.integers(1, 17))).tolist()
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=5, max_tokens=8, seed=2**40 + 3,
                            stop_token_ids=(4,), ignore_eos=True)
    slot = client.submit(prompt, params, request_id=2**40)
    r = shm_ring
    assert r.prompt_tokens[slot, :len(prompt)].tolist() == prompt
    assert r.prompt_len[slot] == len(prompt)
    assert (r.request_id[slot], r.max_tokens[slot], r.top_k[slot], r.seed[slot]) == \
        (2**40, 8, 5, 2**40 + 3)
    assert r.temperature[slot] == np.float32(0.7) and r.top_p[slot] == np.float32(0.9)
    assert r.stop_ids[slot].tolist() == [4, -1] and r.ignore_eos[slot] == 1
    assert r.state[slot] == PREFILL_PENDING and r.arrival_ns[slot] > 0
    bad = [([], "non-empty"), ([1] * 17, "longer than the ring's max_prompt_tokens=16"),
           ([1], "max_tokens=9 is above the ring's max_output_tokens=8"),
           ([1], "3 stop token ids"), ([-1], r"\[0, 2\*\*31\)")]
    kinds = [params, params, SamplingParams(max_tokens=9),
             SamplingParams(max_tokens=2, stop_token_ids=(1, 2, 3)), params]
    for (p, message), q in zip(bad, kinds):
        with pytest.raises(ValueError, match=message):
            client.submit(p, q, request_id=1)
    assert client.occupancy()["EMPTY"] == SMALL.num_slots - 1  # no slot was taken by a failure
    client.cancel(slot)
    assert r.cancel[slot] == 1 and r.state[slot] == PREFILL_PENDING  # only the flag moves


def test_threads_never_get_the_same_slot():
    layout = RingLayout(num_slots=64, max_prompt_tokens=4, max_output_tokens=4)
    ring = local_ring(layout)
    client = RingClient(ring)
    barrier = threading.Barrier(4)

    def fill(worker: int) -> list[int]:
        barrier.wait()
        got = []
        while True:
            try:
                got.append(client.submit([worker], SamplingParams(max_tokens=1), request_id=worker))
            except RingFull:
                return got

    with ThreadPoolExecutor(4) as pool:
        per_thread = list(pool.map(fill, range(4)))
    every = sorted(s for slots in per_thread for s in slots)
    assert every == list(range(64))  # each slot went to exactly one thread
    for worker, slots in enumerate(per_thread):  # and holds that thread's payload
        assert all(ring.prompt_tokens[s, 0] == worker for s in slots)


CHILD = """
import json, sys
from blink_edu.config import SamplingParams
from blink_edu.ring import Ring, RingClient, RingFull
ring = Ring.attach(sys.argv[1])
seen = {"layout": [getattr(ring.layout, k) for k in
                   ("num_slots", "max_prompt_tokens", "max_output_tokens", "max_stop_ids")],
        "prompt": ring.prompt_tokens[0, :ring.prompt_len[0]].tolist(),
        "request_id": int(ring.request_id[0]), "state": int(ring.state[0])}
client, mine = RingClient(ring), []
print("ready", flush=True)
sys.stdin.readline()  # both children start racing at once
while True:
    try:
        mine.append(client.submit([int(sys.argv[2])] * 3, SamplingParams(max_tokens=2),
                                  request_id=int(sys.argv[2])))
    except RingFull:
        break
seen["slots"] = mine
print(json.dumps(seen))
ring.close()
"""


def test_other_processes_attach_by_name_and_share_the_lock():
    layout = RingLayout(num_slots=2000, max_prompt_tokens=4, max_output_tokens=2)
    ring = Ring.create(layout)
    try:
        RingClient(ring).submit([11, 12, 13], SamplingParams(max_tokens=2), request_id=777)
        children = [subprocess.Popen([sys.executable, "-c", CHILD, ring.name, str(i)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                    for i in (1, 2)]
        assert all(c.stdout.readline() == "ready\n" for c in children)
        for c in children:
            c.stdin.write("go\n")
            c.stdin.flush()
        results = [json.loads(c.communicate(timeout=60)[0]) for c in children]
        assert all(c.returncode == 0 for c in children)
        for seen in results:  # each child saw what this process wrote
            assert seen["layout"] == [2000, 4, 2, 4]
            assert seen["prompt"] == [11, 12, 13] and seen["request_id"] == 777
            assert seen["state"] == PREFILL_PENDING
        # They raced for the 1999 free slots: none went to both.
        slots = sorted(results[0]["slots"] + results[1]["slots"])
        assert slots == list(range(1, 2000))
        assert min(len(seen["slots"]) for seen in results) > 100  # it was a race
        for i, seen in enumerate(results, start=1):
            assert all(ring.prompt_tokens[s, 0] == i and ring.request_id[s] == i
                       for s in seen["slots"])
        assert int(ring.doorbell) == 2000
        again = Ring.attach(ring.name)  # the children's exit did not destroy the block
        assert again.request_id[0] == 777
        again.close()
    finally:
        ring.close()
        ring.unlink()
