"""RotaSched's decisions on the device: FCFS, Waiting-First, Swapped-First and LVF as CUDA device
functions over flat arrays, for a persistent scheduler kernel to call.

SuperInfer §3 (RotaSched: Virtual Lag Time, Largest-VLT-First) and its baselines (§2 and §5: FCFS
with passive preemption by recompute as in vLLM v1; the static offload policies Waiting-First and
Swapped-First, the latter vLLM v0's); docs/design.md §6 and §8 ("sched/: policies, one interface,
host and device forms").

Why the decisions move to the device
------------------------------------
Blink §3 takes the host off the per-token loop: a persistent kernel polls the ring, batches the
requests it finds, runs the model and writes the tokens back, with no host thread taking part.
Then nobody on the host is left to call ``policy.decide`` every iteration: the kernel must decide
by itself. This module is that decision: the rules of ``policies.py``, rule for rule (each device
function names its host twin), written as Numba CUDA device functions over arrays. One thread
decides: N is at most a few hundred requests, and every rule but LVF's ranking is one pass over
them. The ranking is the block's work: ``rank_by_vlt``, called by every thread of the block
before thread 0 calls ``decide_step`` (on one thread, an insertion sort of a few hundred VLTs
took milliseconds a decision on an H100: each comparison two dependent loads).

The persistent kernel that will call ``decide_step`` lives elsewhere; here ``decide_on_device``
and ``hold_on_device`` pack a ``StepView`` into arrays, launch a one-thread kernel and turn the
indices it answers back into a ``policies.Decision`` (what the tests compare with the host).

The arrays (the requests listed in the caller's FCFS order, exactly as ``StepView.requests``)::

    state                                       (N,) int32    WAITING | RUNNING | ROTARY (vlt.py)
    t_arr, t_run, t_last                        (N,) float64  seconds; t_last NaN: no token yet,
                                                              it lags from its arrival
    blocks_held, blocks_to_run, blocks_on_host  (N,) int32    as in ``RequestView``
    vlt                                         (N,) float64  scratch: LVF's VLT per request
    order                                       (N,) int32    scratch: a queue, or LVF's ranking
    admit, preempt                              (N,) int32    out: request indices, in order

Nothing is allocated on the device: the caller owns every array, scratch included, so that a
persistent kernel can keep them for its whole life.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..backend import get_backend
from .policies import Decision, StepView, make_policy
from .vlt import ROTARY, RUNNING, WAITING, RotaSchedConfig, vlt_of

cuda = get_backend().cuda

# What ``decide_step`` decides: one of the four policies, or a step between two decisions.
POLICY_FCFS, POLICY_WAITING_FIRST, POLICY_SWAPPED_FIRST, POLICY_LVF, HOLD = 0, 1, 2, 3, 4
#: threads of the block ``decide_on_device`` launches: the ranking split over a few, as over a
#: persistent kernel's block (more would only slow Numba's simulator, a Python thread each)
RANKING_THREADS = 4
POLICY_CODES = {"fcfs": POLICY_FCFS, "waiting-first": POLICY_WAITING_FIRST,
                "swapped-first": POLICY_SWAPPED_FIRST, "lvf": POLICY_LVF}

# --- shared building blocks (host: Policy._preempt_for_growth, Policy._admit_in_order) -----------


@cuda.jit(device=True)
def _count_and_need(state, blocks_to_run, running):
    """(how many requests are running -- or, with ``running`` False, are not -- and the blocks
    they need this step)."""
    count = 0
    blocks = 0
    for i in range(state.shape[0]):
        if (state[i] == RUNNING) == running:
            count += 1
            blocks += blocks_to_run[i]
    return count, blocks


@cuda.jit(device=True)
def _preempt_newest_for_growth(state, blocks_held, blocks_to_run, free_blocks, preempt):
    """Passive preemption (vLLM; host: ``Policy._preempt_for_growth``): while the running
    requests' growth does not fit the free blocks, preempt the most recently admitted (the last
    running one in FCFS order). Writes ``preempt[:k]``; returns (k, requests still running,
    blocks left free after their growth)."""
    num_running, growth = _count_and_need(state, blocks_to_run, True)
    free = free_blocks
    num_preempted = 0
    i = state.shape[0] - 1
    while growth > free and i >= 0:
        if state[i] == RUNNING:
            preempt[num_preempted] = i
            num_preempted += 1
            free += blocks_held[i]
            growth -= blocks_to_run[i]
        i -= 1
    return num_preempted, num_running - num_preempted, free - growth


@cuda.jit(device=True)
def _append_in_state(state, wanted, queue, length):
    """Append the indices of the requests in state ``wanted`` to ``queue[length:]``, in FCFS
    order; returns the queue's new length."""
    for i in range(state.shape[0]):
        if state[i] == wanted:
            queue[length] = i
            length += 1
    return length


@cuda.jit(device=True)
def _list_candidates(state, queue):
    """``queue[:k]`` = every request that is not running (waiting and rotary together), in FCFS
    order; returns k."""
    length = 0
    for i in range(state.shape[0]):
        if state[i] != RUNNING:
            queue[length] = i
            length += 1
    return length


@cuda.jit(device=True)
def _admit_in_order(queue, queue_length, state, blocks_to_run, blocks_on_host, free, seats,
                    budgeted, transfer_left, admit):
    """Admit from the front of ``queue[:queue_length]`` while blocks, seats (and, if
    ``budgeted``, the swap-in budget ``transfer_left``) last, and stop at the first that does not
    fit: no overtaking, nobody starves (host: ``Policy._admit_in_order``; unbudgeted is its
    ``transfer_left=None``). The first admitted of a step may exceed the swap-in budget on its
    own, or a rotary request larger than the budget would never come back. Writes
    ``admit[:k]``; returns k."""
    num_admitted = 0
    for k in range(queue_length):
        i = queue[k]
        swap_in = blocks_on_host[i] if state[i] == ROTARY else 0
        if seats <= 0 or blocks_to_run[i] > free:
            break
        if budgeted and swap_in > transfer_left and num_admitted > 0:
            break
        admit[num_admitted] = i
        num_admitted += 1
        free -= blocks_to_run[i]
        seats -= 1
        if budgeted:
            transfer_left = max(0, transfer_left - swap_in)
    return num_admitted


# --- FCFS and the static offload policies (host: FCFS.decide, _StaticOffload.decide) -------------


@cuda.jit(device=True)
def _fill_queue(policy, state, queue):
    """The admission queue of an in-order policy in ``queue[:k]``; returns k. FCFS: everyone not
    running, in FCFS order; Waiting-First: the waiting, then the rotary; Swapped-First: the
    rotary, then the waiting."""
    if policy == POLICY_FCFS:
        return _list_candidates(state, queue)
    first = WAITING if policy == POLICY_WAITING_FIRST else ROTARY
    second = ROTARY if first == WAITING else WAITING
    length = _append_in_state(state, first, queue, 0)
    return _append_in_state(state, second, queue, length)


@cuda.jit(device=True)
def _preempt_or_admit_in_order(policy, state, blocks_held, blocks_to_run, blocks_on_host,
                               free_blocks, max_num_seqs, transfer_budget_blocks, queue, admit,
                               preempt):
    """FCFS, Waiting-First, Swapped-First: passive preemption of the newest; a step that had to
    preempt admits nobody (vLLM v0 and v1); else admit from the policy's queue in order.
    Returns (num_admitted, num_preempted)."""
    num_preempted, num_running, free = _preempt_newest_for_growth(
        state, blocks_held, blocks_to_run, free_blocks, preempt)
    if num_preempted > 0:
        return 0, num_preempted
    queue_length = _fill_queue(policy, state, queue)
    budgeted = policy != POLICY_FCFS  # FCFS recomputes: it has no swap-in budget
    num_admitted = _admit_in_order(queue, queue_length, state, blocks_to_run, blocks_on_host,
                                   free, max_num_seqs - num_running, budgeted,
                                   transfer_budget_blocks, admit)
    return num_admitted, 0


# --- Largest-VLT-First (host: LVF.decide) --------------------------------------------------------


@cuda.jit(device=True)
def _everyone_fits(state, blocks_to_run, free_blocks, max_num_seqs):
    """LVF's fallback test: every waiting and rotary request fits beside the running requests'
    growth, in blocks and in seats (then LVF is plain FCFS)."""
    num_running, growth = _count_and_need(state, blocks_to_run, True)
    num_candidates, need = _count_and_need(state, blocks_to_run, False)
    return need + growth <= free_blocks and num_candidates <= max_num_seqs - num_running


@cuda.jit(device=True)
def rank_by_vlt(state, t_arr, t_run, t_last, now, alpha, beta_f, ttft_slo_s, beta_b, tbt_slo_s,
                vlt, order):
    """LVF's ranking, by every thread of a block (each takes every blockDim-th request): vlt[i] =
    VLT of request i at ``now`` (vlt.py's ``vlt_of``; a request with no token yet lags from its
    arrival, host: ``view_vlt``), then ``order`` = the request indices by descending VLT, ties
    in FCFS order -- exactly ``np.argsort(-vlt, kind="stable")``. A request's place is how many
    rank before it: a larger VLT, or an equal one earlier in FCFS order (NaN, a running request
    with no run start, last). O(N) per request, every request at once: for N = 256, a thread
    of 128 places two requests with 256 comparisons each, where one thread's insertion sort
    made some 16,000."""
    n, stride = state.shape[0], cuda.blockDim.x
    for i in range(cuda.threadIdx.x, n, stride):
        last = t_arr[i] if math.isnan(t_last[i]) else t_last[i]
        vlt[i] = vlt_of(state[i], now, t_arr[i], t_run[i], last,
                        alpha, beta_f, ttft_slo_s, beta_b, tbt_slo_s)
    cuda.syncthreads()
    for i in range(cuda.threadIdx.x, n, stride):
        place = 0
        for j in range(n):
            if _ranks_before(vlt[j], vlt[i]) or (j < i and not _ranks_before(vlt[i], vlt[j])):
                place += 1
        order[place] = i
    cuda.syncthreads()


@cuda.jit(device=True)
def _ranks_before(a, b):
    """Whether a request of VLT ``a`` ranks strictly before one of VLT ``b``: the larger first,
    NaN (a running request with no run start) last, as ``np.argsort(-vlt)`` places it."""
    if math.isnan(b):
        return not math.isnan(a)
    return a > b


@cuda.jit(device=True)
def _lvf_capacity(state, blocks_held, blocks_to_run, free_blocks, growth,
                  transfer_budget_blocks):
    """Blocks LVF may admit: the free ones plus what rotating running requests out may free this
    iteration (at most B_xfer, at most all they hold and would grow), less the running
    requests' ``growth``."""
    preemptable = 0
    for i in range(state.shape[0]):
        if state[i] == RUNNING:
            preemptable += blocks_held[i] + blocks_to_run[i]
    return min(free_blocks + transfer_budget_blocks - growth, free_blocks - growth + preemptable)


@cuda.jit(device=True)
def _admit_from_head(order, state, blocks_to_run, capacity, admit):
    """Walk the ranking from the largest VLT and admit the waiting and rotary requests while
    ``capacity`` lasts; stop at the first that does not fit. Writes ``admit[:k]``; returns
    (k, the blocks they need)."""
    num_admitted = 0
    blocks = 0
    for k in range(order.shape[0]):
        i = order[k]
        if state[i] == RUNNING:
            continue
        if blocks_to_run[i] > capacity:
            break
        admit[num_admitted] = i
        num_admitted += 1
        blocks += blocks_to_run[i]
        capacity -= blocks_to_run[i]
    return num_admitted, blocks


@cuda.jit(device=True)
def _preempt_from_tail(order, state, blocks_held, blocks_to_run, deficit, num_running,
                       num_admitted, max_num_seqs, preempt):
    """Walk the ranking from the smallest VLT (running the longest) and rotate running requests
    out until the ``deficit`` of blocks is paid and the seats suffice. Writes ``preempt[:k]``;
    returns k."""
    num_preempted = 0
    for k in range(order.shape[0] - 1, -1, -1):
        i = order[k]
        if state[i] != RUNNING:
            continue
        if deficit <= 0 and num_running - num_preempted + num_admitted <= max_num_seqs:
            break
        preempt[num_preempted] = i
        num_preempted += 1
        deficit -= blocks_held[i] + blocks_to_run[i]
    return num_preempted


@cuda.jit(device=True)
def _lvf_ranked(state, blocks_held, blocks_to_run, free_blocks, max_num_seqs,
                transfer_budget_blocks, order, admit, preempt):
    """LVF when memory is short, on the ranking in ``order``: admit from the head, rotate out
    from the tail, then give up the last admitted if even rotating everyone out leaves too few
    seats. Returns (num_admitted, num_preempted)."""
    num_running, growth = _count_and_need(state, blocks_to_run, True)
    capacity = _lvf_capacity(state, blocks_held, blocks_to_run, free_blocks, growth,
                             transfer_budget_blocks)
    num_admitted, admitted_blocks = _admit_from_head(order, state, blocks_to_run, capacity, admit)
    deficit = admitted_blocks + growth - free_blocks
    num_preempted = _preempt_from_tail(order, state, blocks_held, blocks_to_run, deficit,
                                       num_running, num_admitted, max_num_seqs, preempt)
    # Seats: the host pops the last admitted while too many would run; only the admitted that
    # fit the seats left by the staying running requests remain (a prefix of ``admit``).
    num_admitted = min(num_admitted, max_num_seqs - (num_running - num_preempted))
    return num_admitted, num_preempted


@cuda.jit(device=True)
def _lvf(state, blocks_to_run, blocks_held, free_blocks, max_num_seqs, transfer_budget_blocks,
         order, admit, preempt):
    """Largest-VLT-First (SuperInfer §3): plain FCFS when everyone fits, else by the VLT ranking
    in ``order`` (``rank_by_vlt``). Returns (num_admitted, num_preempted, fcfs_fallback)."""
    if _everyone_fits(state, blocks_to_run, free_blocks, max_num_seqs):
        return _list_candidates(state, admit), 0, True
    num_admitted, num_preempted = _lvf_ranked(state, blocks_held, blocks_to_run, free_blocks,
                                              max_num_seqs, transfer_budget_blocks, order, admit,
                                              preempt)
    return num_admitted, num_preempted, False


# --- the entry point a scheduler kernel calls ----------------------------------------------------


@cuda.jit(device=True)
def decide_step(policy, state, t_arr, t_run, t_last, blocks_held, blocks_to_run, blocks_on_host,
                now, free_blocks, max_num_seqs, alpha, beta_f, ttft_slo_s, beta_b, tbt_slo_s,
                transfer_budget_blocks, vlt, order, admit, preempt):
    """One step's decision by ``policy`` (a POLICY_* code, or HOLD: the batch stands, nobody is
    admitted, the newest are preempted only if the others cannot grow; host: ``Policy.hold``),
    by one thread. Arrays as in the module docstring; for LVF the block has ranked the requests
    already (``rank_by_vlt``: ``vlt`` and ``order``; the times, ``now`` and RotaSched's
    parameters are what it ranked by). Writes ``admit[:num_admitted]`` and
    ``preempt[:num_preempted]`` (request indices, in order); returns (num_admitted,
    num_preempted, fcfs_fallback)."""
    if policy == HOLD:
        num_preempted, _, _ = _preempt_newest_for_growth(state, blocks_held, blocks_to_run,
                                                         free_blocks, preempt)
        return 0, num_preempted, False
    if policy == POLICY_LVF:
        return _lvf(state, blocks_to_run, blocks_held, free_blocks, max_num_seqs,
                    transfer_budget_blocks, order, admit, preempt)
    num_admitted, num_preempted = _preempt_or_admit_in_order(
        policy, state, blocks_held, blocks_to_run, blocks_on_host, free_blocks, max_num_seqs,
        transfer_budget_blocks, order, admit, preempt)
    return num_admitted, num_preempted, False


@cuda.jit
def decide_kernel(policy, state, t_arr, t_run, t_last, blocks_held, blocks_to_run,
                  blocks_on_host, now, free_blocks, max_num_seqs, alpha, beta_f, ttft_slo_s,
                  beta_b, tbt_slo_s, transfer_budget_blocks, vlt, order, admit, preempt, counts):
    """One block: LVF's ranking by every thread (``rank_by_vlt``), then thread 0 calls
    ``decide_step``; counts (3,) int32 = num_admitted, num_preempted, fcfs_fallback (0 or 1)."""
    if policy == POLICY_LVF:
        rank_by_vlt(state, t_arr, t_run, t_last, now, alpha, beta_f, ttft_slo_s, beta_b,
                    tbt_slo_s, vlt, order)
    if cuda.threadIdx.x == 0:
        num_admitted, num_preempted, fcfs_fallback = decide_step(
            policy, state, t_arr, t_run, t_last, blocks_held, blocks_to_run, blocks_on_host,
            now, free_blocks, max_num_seqs, alpha, beta_f, ttft_slo_s, beta_b, tbt_slo_s,
            transfer_budget_blocks, vlt, order, admit, preempt)
        counts[0] = num_admitted
        counts[1] = num_preempted
        counts[2] = 1 if fcfs_fallback else 0


# --- the host wrapper ----------------------------------------------------------------------------


class StepArrays(NamedTuple):
    """A ``StepView``'s requests as the flat arrays ``decide_step`` reads (FCFS order)."""

    state: np.ndarray  # (N,) int32
    t_arr: np.ndarray  # (N,) float64
    t_run: np.ndarray  # (N,) float64
    t_last: np.ndarray  # (N,) float64, NaN: no token yet
    blocks_held: np.ndarray  # (N,) int32
    blocks_to_run: np.ndarray  # (N,) int32
    blocks_on_host: np.ndarray  # (N,) int32


def pack_view(view: StepView) -> StepArrays:
    """The requests of ``view`` as flat arrays, in its (FCFS) order."""
    requests = view.requests
    ints = np.array([(r.state, r.blocks_held, r.blocks_to_run, r.blocks_on_host)
                     for r in requests], dtype=np.int32).reshape(-1, 4)  # (N, 4)
    times = np.array([(r.arrival_time, r.run_start_time, r.last_token_time)
                      for r in requests], dtype=np.float64).reshape(-1, 3)  # (N, 3)
    state, held, to_run, on_host = (np.ascontiguousarray(c) for c in ints.T)  # (N,) each
    t_arr, t_run, t_last = (np.ascontiguousarray(c) for c in times.T)  # (N,) each
    return StepArrays(state, t_arr, t_run, t_last, held, to_run, on_host)


def _decide_indices(code: int, view: StepView, config: RotaSchedConfig):
    """Launch ``decide_kernel`` (one block) on ``view``; returns (admitted indices, preempted
    indices, fcfs_fallback, the vlt scratch (N,) float64)."""
    arrays = pack_view(view)
    n = len(view.requests)
    vlt = np.zeros(n, dtype=np.float64)  # (N,) scratch
    order = np.zeros(n, dtype=np.int32)  # (N,) scratch
    admit = np.zeros(n, dtype=np.int32)  # (N,) out
    preempt = np.zeros(n, dtype=np.int32)  # (N,) out
    counts = np.zeros(3, dtype=np.int32)  # (3,) out: num_admitted, num_preempted, fallback
    decide_kernel[1, RANKING_THREADS](
        code, *arrays, float(view.now), int(view.free_blocks), int(view.max_num_seqs),
        float(config.alpha), float(config.beta_f), float(config.ttft_slo_s),
        float(config.beta_b), float(config.tbt_slo_s), int(config.transfer_budget_blocks),
        vlt, order, admit, preempt, counts)
    num_admitted, num_preempted, fallback = (int(c) for c in counts)
    return admit[:num_admitted].tolist(), preempt[:num_preempted].tolist(), bool(fallback), vlt


def _on_device(policy_name: str, view: StepView, config: RotaSchedConfig, hold: bool
               ) -> Decision:
    """The decision (or, with ``hold``, the hold) of policy ``policy_name``, made on the device."""
    policy = make_policy(policy_name, config)  # refuses an unknown name
    code = HOLD if hold else POLICY_CODES[policy_name]
    admit, preempt, fallback, vlt = _decide_indices(code, view, config)
    ids = [r.request_id for r in view.requests]
    extra = {"fcfs_fallback": fallback}
    if code == POLICY_LVF and not fallback:  # as the host LVF: the VLT it ranked by, per id
        extra["vlt"] = dict(zip(ids, vlt.tolist()))
    # the host's own mapping of "preempted" to rotary or recompute, by the policy's kind
    return policy._decision([ids[i] for i in admit], [ids[i] for i in preempt], **extra)


def decide_on_device(policy_name: str, view: StepView,
                     config: RotaSchedConfig = RotaSchedConfig()) -> Decision:
    """``make_policy(policy_name, config).decide(view)``, decided by ``decide_step`` on the
    device."""
    return _on_device(policy_name, view, config, hold=False)


def hold_on_device(policy_name: str, view: StepView,
                   config: RotaSchedConfig = RotaSchedConfig()) -> Decision:
    """``make_policy(policy_name, config).hold(view)``, decided by ``decide_step`` on the
    device."""
    return _on_device(policy_name, view, config, hold=True)
