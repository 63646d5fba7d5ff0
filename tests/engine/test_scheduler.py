"""The scheduler on its own, driven by a stand-in model that reads its whole context back through
the paged cache: a wrong block table, a wrong position, or a stale cache after a preemption all
change what it "generates". Covers decode-first budgets, chunked prefill, preemption by
recompute, admission limits, rejection, abort, and random traffic (hypothesis)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blink_edu.config import EngineConfig, SamplingParams
from blink_edu.engine.scheduler import Scheduler
from blink_edu.engine.sequence import Sequence, SequenceStatus

VOCAB = 40
EOS = 0


def next_token(context, seed: int, counter: int) -> int:
    """The stand-in model: a hash of every token it sees, the request's seed and the counter."""
    data = np.asarray([*context, seed, counter], dtype=np.int64).tobytes()
    return zlib.crc32(data) % VOCAB


class PagedToyModel:
    """An executor whose "K/V" is the token id itself: it writes each token into its paged slot,
    then for each sequence hashes the context it reads back through the block table."""

    def __init__(self, num_blocks: int, block_size: int):
        self.pool = np.full((num_blocks, block_size), -1, dtype=np.int64)  # (N, B)
        self.batches = []

    def step(self, batch) -> np.ndarray:
        self.batches.append(batch)
        B = self.pool.shape[1]
        blocks = batch.block_tables[batch.seq_rows, batch.positions // B]  # (T,)
        assert (blocks >= 0).all(), "a token has no block"
        self.pool[blocks, batch.positions % B] = batch.token_ids
        sampled = []
        for row, last in enumerate(batch.logit_rows):
            positions = np.arange(batch.positions[last] + 1)  # (C,) the whole context
            context = self.pool[batch.block_tables[row, positions // B], positions % B]  # (C,)
            sampled.append(next_token(context, int(batch.seeds[row]), int(batch.counters[row])))
        return np.array(sampled, dtype=np.int32)  # (S,)


def expected_tokens(prompt: list[int], params: SamplingParams) -> list[int]:
    """What the toy model generates for one request alone, recomputing from scratch each time."""
    tokens, out = list(prompt), []
    while len(out) < params.max_tokens:
        token = next_token(tokens, params.seed, len(out))
        out.append(token)
        tokens.append(token)
        if token in params.stop_token_ids or (token == EOS and not params.ignore_eos):
            break
    return out


def make(block_size=4, num_kv_blocks=64, max_num_seqs=8, budget=64, max_model_len=256):
    config = EngineConfig(block_size=block_size, num_kv_blocks=num_kv_blocks,
                          max_num_seqs=max_num_seqs, max_num_batched_tokens=budget)
    return Scheduler(config, max_model_len, eos_token_ids=(EOS,)), PagedToyModel(num_kv_blocks,
                                                                                block_size)


def params(max_tokens=8, seed=7, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, seed=seed, **kw)


def one_step(scheduler: Scheduler, model: PagedToyModel, now: float = 0.0):
    """Schedule, run, postprocess, check invariants; returns (batch, scheduled, produced)."""
    batch, scheduled = scheduler.schedule()
    assert batch.num_tokens <= scheduler.max_num_batched_tokens
    assert len(scheduler.running) <= scheduler.max_num_seqs
    produced = scheduler.postprocess(scheduled, model.step(batch), now)
    scheduler.block_manager.check()
    return batch, scheduled, produced


def run_to_completion(scheduler: Scheduler, model: PagedToyModel, max_steps: int = 5000) -> None:
    for _ in range(max_steps):
        if not scheduler.has_unfinished():
            break
        one_step(scheduler, model)
    assert not scheduler.has_unfinished(), "did not finish"
    assert scheduler.block_manager.num_free == scheduler.block_manager.num_blocks


def test_decodes_go_first_and_a_long_prompt_is_chunked_into_the_rest():
    scheduler, model = make(block_size=4, budget=8)
    a = Sequence(0, [5, 6, 7, 8, 9], params(ignore_eos=True))
    scheduler.add(a)
    one_step(scheduler, model)
    assert a.num_output_tokens == 1 and a.num_cached_tokens == 5
    b = Sequence(1, list(range(1, 21)), params(ignore_eos=True))  # 20 tokens, budget 8
    scheduler.add(b)
    for step, b_start, b_len in [(0, 0, 7), (1, 7, 7), (2, 14, 6)]:
        batch, scheduled, produced = one_step(scheduler, model)
        assert scheduled == [a, b]  # the decode first, then the prompt chunk, in ONE batch
        assert batch.token_ids[0] == a.token_ids[5 + step] and batch.positions[0] == 5 + step
        assert batch.token_ids[1:].tolist() == b.prompt_token_ids[b_start:b_start + b_len]
        assert batch.positions[1:].tolist() == list(range(b_start, b_start + b_len))
        assert batch.counters.tolist() == [1 + step, 0]
        assert b.num_cached_tokens == b_start + b_len
        assert produced == ([a] if step < 2 else [a, b])  # b samples only once its prompt is in
    assert b.output_token_ids == expected_tokens(b.prompt_token_ids, b.params)[:1]
    run_to_completion(scheduler, model)
    for seq in (a, b):
        assert seq.output_token_ids == expected_tokens(seq.prompt_token_ids, seq.params)
        assert seq.finish_reason == "length"


def test_preemption_evicts_the_newest_and_it_resumes_with_identical_tokens():
    # Block size 2, 6 blocks: three 3-token prompts take 2 blocks each and fill the pool;
    # a fourth waits (max_num_seqs=3).
    scheduler, model = make(block_size=2, num_kv_blocks=6, max_num_seqs=3)
    seqs = [Sequence(i, [10 + i, 20 + i, 30 + i], params(max_tokens=6, seed=i, ignore_eos=True))
            for i in range(4)]
    for seq in seqs:
        scheduler.add(seq)
    one_step(scheduler, model)  # three admitted: 6 blocks used
    one_step(scheduler, model)  # 4 tokens each still fit in 2 blocks
    assert scheduler.block_manager.num_free == 0 and scheduler.num_preemptions == 0
    a, b, c, d = seqs
    _, scheduled, _ = one_step(scheduler, model)  # a needs a 3rd block: c (newest) is preempted
    assert scheduled == [a, b]
    assert list(scheduler.waiting) == [c, d]  # c goes to the FRONT of the queue
    assert c.status is SequenceStatus.PREEMPTED
    assert c.num_cached_tokens == 0 and c.num_output_tokens == 2  # its tokens are kept
    assert scheduler.num_preemptions == scheduler.num_recomputes == 1
    # When c comes back, it re-fills the cache with prompt + generated tokens and samples on.
    while c.status is not SequenceStatus.RUNNING:
        batch, scheduled, _ = one_step(scheduler, model)
    row = scheduled.index(c)
    mine = batch.seq_rows == row
    assert batch.token_ids[mine].tolist() == c.prompt_token_ids + c.output_token_ids[:2]
    assert batch.positions[mine].tolist() == list(range(5))
    assert batch.counters[row] == 2
    run_to_completion(scheduler, model)
    for seq in seqs:
        assert seq.output_token_ids == expected_tokens(seq.prompt_token_ids, seq.params)


def test_max_num_seqs_caps_the_running_set():
    scheduler, model = make(max_num_seqs=2)
    seqs = [Sequence(i, [i + 1] * 3, params(seed=i)) for i in range(5)]
    for seq in seqs:
        scheduler.add(seq)
    _, scheduled, _ = one_step(scheduler, model)
    assert scheduled == seqs[:2] and len(scheduler.waiting) == 3
    run_to_completion(scheduler, model)
    for seq in seqs:
        assert seq.output_token_ids == expected_tokens(seq.prompt_token_ids, seq.params)


def test_stop_token_and_eos_end_a_sequence_with_reason_stop():
    prompt = [3, 4, 5]
    free_run = expected_tokens(prompt, params(max_tokens=12, ignore_eos=True))
    stop = free_run[4]
    scheduler, model = make()
    stopped = Sequence(0, prompt, params(max_tokens=12, ignore_eos=True, stop_token_ids=(stop,)))
    scheduler.add(stopped)
    run_to_completion(scheduler, model)
    assert stopped.output_token_ids == free_run[:free_run.index(stop) + 1]
    assert stopped.finish_reason == "stop"
    # The same token as EOS: honoured unless ignore_eos.
    scheduler = Scheduler(EngineConfig(block_size=4, num_kv_blocks=64), 256, eos_token_ids=(stop,))
    by_eos = Sequence(0, prompt, params(max_tokens=12))
    ignoring = Sequence(1, prompt, params(max_tokens=12, ignore_eos=True))
    scheduler.add(by_eos)
    scheduler.add(ignoring)
    run_to_completion(scheduler, PagedToyModel(64, 4))
    assert by_eos.output_token_ids == stopped.output_token_ids and by_eos.finish_reason == "stop"
    assert ignoring.output_token_ids == free_run and ignoring.finish_reason == "length"


def test_add_rejects_what_could_never_fit_and_accepts_an_exact_fit():
    scheduler, _ = make(block_size=4, num_kv_blocks=3, max_model_len=20)
    with pytest.raises(ValueError, match="exceeds max_model_len=20"):
        scheduler.add(Sequence(0, [1] * 15, params(max_tokens=6)))
    with pytest.raises(ValueError, match="whole pool has 3"):
        scheduler.add(Sequence(1, [1] * 8, params(max_tokens=6)))  # K/V for 13 tokens: 4 blocks
    assert not scheduler.has_unfinished()
    exact = Sequence(2, [1] * 7, params(max_tokens=6, ignore_eos=True))  # K/V for 12: 3 blocks
    scheduler.add(exact)
    run_to_completion(scheduler, PagedToyModel(3, 4))
    assert exact.output_token_ids == expected_tokens(exact.prompt_token_ids, exact.params)


def test_abort_frees_blocks_whatever_the_state():
    scheduler, model = make(block_size=2, num_kv_blocks=8, budget=5)
    seqs = [Sequence(i, list(range(1, 8)), params(max_tokens=10, seed=i, ignore_eos=True))
            for i in range(4)]
    for seq in seqs:
        scheduler.add(seq)
    one_step(scheduler, model)  # seq 0 has 5 of its 7 prompt tokens in 3 blocks; others wait
    prefilling, waiting = seqs[0], seqs[3]
    assert prefilling.status is SequenceStatus.RUNNING and not prefilling.is_decoding
    free_before = scheduler.block_manager.num_free
    scheduler.abort(prefilling)
    assert scheduler.block_manager.num_free == free_before + 3
    scheduler.abort(waiting)
    for seq in (prefilling, waiting):
        assert seq.finish_reason == "abort" and seq.is_finished
    while not seqs[1].output_token_ids:
        one_step(scheduler, model)
    scheduler.abort(seqs[1])  # a decoding sequence
    assert seqs[1] not in scheduler.running
    scheduler.block_manager.check()
    run_to_completion(scheduler, model)
    assert seqs[2].output_token_ids == expected_tokens(seqs[2].prompt_token_ids, seqs[2].params)
    assert scheduler.block_manager.num_free == 8


request_strategy = st.tuples(
    st.integers(0, 6),  # arrival step
    st.integers(1, 14),  # prompt length
    st.integers(1, 10),  # max_tokens
    st.booleans(),  # ignore_eos
    st.integers(0, 2**32 - 1),  # seed
)


@settings(max_examples=300, deadline=None)
@given(requests=st.lists(request_strategy, min_size=1, max_size=8),
       block_size=st.integers(1, 5), extra_blocks=st.integers(0, 6),
       budget=st.integers(1, 24), max_num_seqs=st.integers(1, 6),
       abort_at=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 20)), max_size=2))
def test_random_traffic_every_request_finishes_once_with_its_own_tokens(
        requests, block_size, extra_blocks, budget, max_num_seqs, abort_at):
    # The pool fits the largest request on its own, plus a few blocks: preemption is common.
    biggest = max(-(-(n + m - 1) // block_size) for _, n, m, _, _ in requests)
    scheduler, model = make(block_size, biggest + extra_blocks, max_num_seqs, budget)
    seqs = [Sequence(i, [1 + (i * 7 + j) % (VOCAB - 1) for j in range(n)],
                     params(max_tokens=m, seed=seed, ignore_eos=ignore))
            for i, (_, n, m, ignore, seed) in enumerate(requests)]
    not_yet_added = {i: arrival for i, (arrival, *_) in enumerate(requests)}
    aborts = {step: i for i, step in abort_at if i < len(seqs)}  # step -> which request
    times_finished = [0] * len(seqs)
    step = 0
    while not_yet_added or scheduler.has_unfinished():
        for i in [i for i, arrival in not_yet_added.items() if arrival <= step]:
            del not_yet_added[i]
            scheduler.add(seqs[i])
        if step in aborts and aborts[step] not in not_yet_added:
            scheduler.abort(seqs[aborts[step]])
        if scheduler.has_unfinished():
            _, _, produced = one_step(scheduler, model, now=step)
            for seq in produced:
                times_finished[seq.seq_id] += seq.is_finished
        step += 1
        assert step < 5000
    assert scheduler.block_manager.num_free == scheduler.block_manager.num_blocks
    for seq in seqs:
        assert seq.is_finished
        if seq.finish_reason == "abort":
            assert times_finished[seq.seq_id] == 0
            continue
        assert times_finished[seq.seq_id] == 1
        want = expected_tokens(seq.prompt_token_ids, seq.params)
        assert seq.output_token_ids == want
        by_eos = want[-1] == EOS and not seq.params.ignore_eos
        assert seq.finish_reason == ("stop" if by_eos else "length")
        assert len(seq.token_times) == len(want) and seq.first_token_time == seq.token_times[0]
