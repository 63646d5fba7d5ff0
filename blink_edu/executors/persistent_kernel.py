"""The persistent scheduler kernel: one GPU kernel that owns the serving loop, forever.

Blink §3 ("a persistent GPU-resident scheduler ... scan ring buffer -> claim via atomic CAS ->
batch -> run -> publish tokens") and §7, docs/design.md §2 (*inline* dispatch: the forward pass runs
inside the same cooperative kernel, its phases separated by grid barriers — the MPK-style
megakernel, and the only form that runs in Numba's simulator).

The kernel is launched once and loops until the host raises a stop flag. One iteration:

    A  block 0       read      the host's words, all at once (one round trip over PCIe): doorbell,
                               stop flag, the cancel flags of running lanes (cancelled lanes
                               finish); the heartbeat goes out
       ---- grid barrier ----
       every block   scan      only if the doorbell moved: look at every slot's state word
                               (grid-strided: each thread reads a few), note PREFILL_PENDING ones
       ---- grid barrier (only after a scan) ----
    B  block 0       schedule  claim pending slots in arrival order (FCFS) while a lane and the
                               KV blocks of a first chunk are free; plan this step: decodes
                               first, then prompt chunks within the token budget, each taking
                               the blocks its tokens need, preempting when the pool runs
                               out (a thread per lane, a block-wide scan); under a RotaSched
                               policy its decision first, rotations copied by the block
       ---- grid barrier ----
    C  every block   forward   the model over the step's flat batch, then sampling: the op list of
                               ``forward_ops.py``, the device functions the eager and graph
                               executors launch one by one, a grid barrier after each op
    D  block 0       publish   each new token into the ring: arena, then the `generated` counter
                               (release), then the state; stop rules; finished lanes free blocks

Words the host writes (the ring's states, doorbell, cancel flags, the stop flag) are read with
``load_acquire``; words the host reads are published with ``store_release`` (kernels/sync.py).
The host thread that launched the kernel makes no CUDA call while it runs.

A, B and D are device functions (``read_host_words``, ``schedule_step``, ``publish_step``) that the
other dispatcher's one-block scheduler kernel calls too (``graph_dispatch.py``: it launches C as a
CUDA graph from the GPU instead of running it).

**Lanes.** The batch has ``S`` lanes (``max_num_seqs``); a claimed request occupies one until it
finishes. ``lanes[s]`` holds its ring slot, tokens cached, tokens known, prompt length, admission
number, tokens generated, sampling seed, its place in this step's flat batch, its last token and
its stop rules (int64 words); ``lane_sampling[s]`` its temperature and top-p, ``lane_stop_ids[s]``
its stop ids. Lane ``s`` uses row ``s`` of ``block_tables``.

**What a step costs besides the model** is mostly waiting: a grid barrier (~1.7 µs on the H200,
whatever the grid size), a read of host memory across PCIe (~1–2 µs), a loop that one thread
walks. So the kernel copies each request's parameters into its lane once, at admission (a step
then reads no ring field but the prompt), reads the host's words once per step and all at once,
skips the scan and its barrier while the doorbell is quiet, and plans the step with a thread per
lane (``bench.persistent`` reports the time of each phase).

**KV blocks** come from a stack of free block ids (``free_blocks``, ``free_top``), *on demand*:
a lane takes the block a token needs when the step that writes it is planned (SuperInfer §2: a
reservation made at admission for every token a request *may* generate leaves most of the pool
idle). Admission only asks that the first prompt chunk fit; a request that could never fit the
whole pool fails at once. When a decode needs a block and the stack is empty, the host
scheduler's FCFS rules apply (``engine/scheduler.py``): decodes are served oldest admission
first, and the **most recently admitted** lane that holds blocks is **preempted by recompute** —
its blocks go back to the stack and it keeps its lane, its tokens, its seed and its counter: its
prompt becomes everything it knew (prompt + generated tokens, read back from the ring's arenas)
and it refills its cache later, sampling exactly what it would have. A step that preempted starts
no new prompt.

**Rotation** (``EngineConfig(preemption="rotate")``, SuperInfer §4): a victim with tokens cached
is *rotated out* instead, if the host arena (pinned host memory mapped into the GPU:
``host_kv``) has room — block 0's threads copy its blocks there themselves (zero-copy: no host
thread, no cudaMemcpy), then its GPU blocks go back to the stack. Each step starts by rotating
lanes back in, oldest first, while the pool has blocks for one and for the next token of every
decoding lane (the host scheduler's ``_resume_rotated``), and starts no new prompt while any lane
is still out. A rotated lane resumes exactly where it stopped. **DuplexKV** (SuperInfer §4): a
full block never changes again, so it is copied to the host arena eagerly, by threads that
would otherwise wait (``plan_mirror``, ``copy_mirror``); a lane's L_SYNCED counts its blocks
with a current copy there, and a rotate-out copies only the rest, the dirty tail.

**RotaSched** (``EngineConfig(policy="lvf")``, or the baselines ``"waiting-first"`` and
``"swapped-first"``; SuperInfer §3). The kernel keeps more lanes than the batch: a claimed
request waits in its lane (L_RUNNING 0) until the policy admits it. At the head of each decision
step (``rotasched_step``) block 0 lists the lanes as the host engine lists its sequences —
running, waiting, rotated out, each in FCFS order, with their blocks and times
(``describe_lanes``) — the block ranks them by VLT, thread 0 calls the host policy's device twin
(``decide_step``), and the block carries the decision out: rotate-outs first, then admissions,
a rotated-out one copied back in. Between decisions the batch stands and FCFS's growth rules above preempt. Same tokens
whatever the policy: only *when* a request runs changes.

**Claiming.** Only one thread (block 0, thread 0) ever moves a slot out of PREFILL_PENDING, and no
other agent may: the state machine gives PENDING slots to the engine alone. A compare-and-swap
makes the claim; on PCIe-mapped host memory GPU atomics are not coherent with the host (docs/design.md
§5), so there the claim is ``load_acquire`` == PENDING followed by ``store_release`` — the same
guarantee with one claimer.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from numba import float32, int32, int64

from ..kernels.reduce import THREADS, block_exclusive_sum, cuda
from ..kernels.sampling import lowbias32
from ..kernels.sync import globaltimer_ns, load_acquire, pause_ns, store_release
from ..ring.layout import (DECODE_COMPLETED, DECODE_PAUSED, DECODE_PROCESSING, FINISH_ABORT,
                           FINISH_ERROR, FINISH_LENGTH, FINISH_STOP, PREFILL_PENDING,
                           PREFILL_PROCESSING)
from ..sched.device_policy import POLICY_FCFS, POLICY_LVF, decide_step, rank_by_vlt
from ..sched.vlt import ROTARY, RUNNING, WAITING
from .forward_ops import LANE_SLOT, forward

MAX_CANDIDATES = 64  # pending slots one scan can note; more wait for the next scan
MAX_MIRROR_BLOCKS = 64  # full blocks one step copies out eagerly; more wait for the next steps
COPY_UNROLL = 8  # words a thread loads before it stores them, copying a KV block (copy_block)


class RingArrays(NamedTuple):
    """The ring's fields as the kernel sees them (``ring/layout.py``; host memory mapped into the
    GPU, or device memory): per slot, (num_slots,) unless shown otherwise."""

    state: object  # the slot's state word (ring/layout.py's state machine)
    doorbell: object  # (1,) rung by a frontend after it made a slot PENDING
    engine_heartbeat: object  # (1,) the engine's beat, for the frontend's /health
    arrival_ns: object
    claim_ns: object
    first_token_ns: object
    last_token_ns: object
    prompt_len: object
    max_tokens: object
    top_k: object
    seed: object
    temperature: object
    top_p: object
    stop_ids: object  # (num_slots, max_stop_ids)
    ignore_eos: object
    cancel: object
    generated: object  # tokens published so far (the frontend reads up to here)
    finish_reason: object
    prompt_tokens: object  # (num_slots, max_prompt_tokens)
    output_tokens: object  # (num_slots, max_output_tokens)


class SchedulerState(NamedTuple):
    """The scheduler's own state, in device memory (the module docstring: lanes, KV blocks)."""

    lanes: object  # (S, NUM_LANE_FIELDS) i64
    lane_sampling: object  # (S, 2) f32 temperature, top-p
    lane_stop_ids: object  # (S, max_stop_ids) i32
    eos_ids: object  # (n,) i32 the model's end-of-sequence ids
    block_tables: object  # (S, W) i32 lane s's KV blocks, -1 past its last
    free_blocks: object  # (N,) i32 a stack of free block ids ...
    free_top: object  # (1,) i32 ... and its height
    sched: object  # (NUM_SCHED_WORDS,) i64 bookkeeping (S_*)
    candidates: object  # (MAX_CANDIDATES,) i32 PENDING slots the last scan noted
    kv_blocks: object  # (N, L*2*B*K*E) f32 the model's KV pool, one row a block (a view of it)
    host_kv: object  # (NH, L*2*B*K*E) f32 the host arena (mapped host memory)
    host_tables: object  # (S, W) i32 a lane's host blocks (L_SYNCED of them), -1 past its last
    host_free_blocks: object  # (NH,) i32 a stack of free host blocks ...
    host_free_top: object  # (1,) i32 ... and its height (0 from the start: no rotation)
    policy: object  # (NUM_POLICY_WORDS,) f64 the policy and its parameters (P_*)
    decide_ints: object  # (8, S) i32 the policy's view and answers (D_STATE ... D_LANE)
    decide_floats: object  # (4, S) f64 its times, seconds (D_T_ARR ... D_VLT)
    mirror_pairs: object  # (2, MAX_MIRROR_BLOCKS) i32 this step's eager copies: GPU, host block

# lanes[s, field]
# L_LEN: tokens known (prompt + generated); L_PROMPT: tokens to prefill before decoding (the
# ring's prompt, or after a preemption by recompute everything known); L_RING_PROMPT: the ring's
# prompt length (token j of the lane is prompt_tokens[slot, j] below it, output_tokens above);
# L_ROTATED: 1 while its KV is in the host arena; L_RUNNING: 1 in the running batch (0: waiting
# for a policy to admit it, or rotated out); L_ARRIVAL_NS, L_RUN_NS, L_LAST_NS: when it arrived,
# was admitted to the batch and published its last token (host clock, -1: not yet), for VLT.
# L_SYNCED: how many of its first blocks have a current copy in the host arena (DuplexKV's
# Synced blocks: full ones, copied eagerly; a rotated-out lane's are all there). Mostly its host
# blocks, but not while a rotate-out is under way: its host blocks then include those reserved
# for the dirty tail, which ``rotate`` copies from L_SYNCED on.
(L_SLOT, L_CACHED, L_LEN, L_PROMPT, L_ORDER, L_GEN, L_SCHED, L_SAMPLE_ROW, L_SEED, L_START,
 L_LAST_TOKEN, L_MAX_TOKENS, L_IGNORE_EOS, L_TOP_K, L_RING_PROMPT, L_ROTATED, L_RUNNING,
 L_ARRIVAL_NS, L_RUN_NS, L_LAST_NS, L_SYNCED) = range(21)
NUM_LANE_FIELDS = 21
assert L_SLOT == LANE_SLOT  # forward_ops reads a lane's slot without importing this module
# sched[word]: the kernel's own bookkeeping, in device memory
(S_STOP, S_TOKENS, S_ROWS, S_DOORBELL_SEEN, S_DOORBELL_NOW, S_ADMITTED, S_CANDIDATES,
 S_SCAN_START, S_STEPS, S_SCAN_NS, S_SCANS, S_IDLE, S_CLOCK_OFFSET, S_STEP_START,
 S_FORWARD_START, S_BEATS, S_CLAIMED, S_SCHEDULE_NS, S_FORWARD_NS, S_PUBLISH_NS,
 S_PREEMPTIONS, S_ROTATIONS, S_ROTATE_INS, S_DECISIONS, S_BLOCKS_OUT, S_BLOCKS_IN,
 S_MIRROR_COUNT, S_BLOCKS_MIRRORED) = range(28)
NUM_SCHED_WORDS = 28
# policy[word]: the scheduling policy (a sched/device_policy.py POLICY_* code: FCFS is the
# kernel's own rules) and RotaSched's parameters (sched/vlt.py's RotaSchedConfig)
(P_CODE, P_ALPHA, P_BETA_F, P_TTFT_SLO_S, P_BETA_B, P_TBT_SLO_S, P_TRANSFER_BUDGET,
 P_DECISION_INTERVAL, P_MAX_RUNNING) = range(9)
NUM_POLICY_WORDS = 9
# decide_ints[row], decide_floats[row]: one column per request the policy sees (in FCFS order)
(D_STATE, D_HELD, D_TO_RUN, D_ON_HOST, D_ORDER, D_ADMIT, D_PREEMPT, D_LANE) = range(8)
(D_T_ARR, D_T_RUN, D_T_LAST, D_VLT) = range(4)
# control[word]: shared with the host (mapped memory); the kernel only writes them, except the
# stop flag. The *_NS words are cumulative GPU time of the phases of every step that ran the
# model: A+B (reads, scan, schedule and their barriers), C (forward), D (publish).
# C_RELAUNCHES and C_DISPATCH_ERROR are the device-graph dispatcher's (graph_dispatch.py): its
# tail self-relaunches, and the CUDA error of a device-side launch that failed (the kernel then
# ends). C_PREEMPTIONS: lanes preempted so far (by recompute or rotation), C_ROTATIONS of them
# rotated out; C_ROTATE_INS: rotated back in; C_HOST_FREE_BLOCKS: the host arena's free blocks;
# C_WAITING: lanes holding a request outside the running batch; C_DECISIONS: a policy's decisions;
# C_BLOCKS_OUT, C_BLOCKS_IN: KV blocks the rotations copied to the host arena (the dirty ones
# only) and back; C_BLOCKS_MIRRORED: full blocks copied out eagerly, off the rotations' path.
(C_STOP, C_STEPS, C_SCAN_NS, C_SCANS, C_CLAIMED, C_RUNNING, C_FREE_BLOCKS,
 C_SCHEDULE_NS, C_FORWARD_NS, C_PUBLISH_NS, C_RELAUNCHES, C_DISPATCH_ERROR,
 C_PREEMPTIONS, C_ROTATIONS, C_ROTATE_INS, C_HOST_FREE_BLOCKS, C_WAITING,
 C_DECISIONS, C_BLOCKS_OUT, C_BLOCKS_IN, C_BLOCKS_MIRRORED) = range(21)
NUM_CONTROL_WORDS = 21
CANDIDATES_SHAPE = (MAX_CANDIDATES,)
IDLE_SLEEP_NS = 2000


@cuda.jit(device=True, inline=True)
def grid_sync():
    """A barrier for every thread of every block (the launch must be cooperative)."""
    cuda.cg.this_grid().sync()


# --- A: scan ------------------------------------------------------------------------------------
@cuda.jit(device=True)
def scan_ring(state, sched, candidates, thread, n_threads):
    """Note the PREFILL_PENDING slots in ``candidates`` (this thread's share of the slots)."""
    for slot in range(thread, state.shape[0], n_threads):
        if load_acquire(state, slot) == PREFILL_PENDING:
            k = cuda.atomic.add(sched, S_CANDIDATES, 1)
            if k < MAX_CANDIDATES:
                candidates[k] = slot


# --- KV blocks, on demand -----------------------------------------------------------------------
@cuda.jit(device=True)
def blocks_held(lane, tables):
    """How many blocks ``lane`` holds in ``tables`` (its blocks are a prefix of its row)."""
    n = 0
    while n < tables.shape[1] and tables[lane, n] >= 0:
        n += 1
    return n


@cuda.jit(device=True)
def release_blocks(lane, first, tables, free_blocks, free_top):
    """Give a lane's blocks from entry ``first`` on back to their free stack: the GPU pool's, or
    the host arena's."""
    n = blocks_held(lane, tables) - first
    if n <= 0:
        return
    base = cuda.atomic.add(free_top, 0, int32(n))  # several threads may free lanes at once
    for j in range(n):
        free_blocks[base + j] = tables[lane, first + j]
        tables[lane, first + j] = -1


@cuda.jit(device=True)
def take_range(lane, first, n, tables, free_blocks, free_top):
    """Thread 0: pop blocks off a free stack (the GPU pool's or the host arena's) into entries
    ``first`` to ``n`` - 1 of ``lane``'s row of ``tables`` (the caller made sure it holds them)."""
    for j in range(first, n):
        free_top[0] -= 1
        tables[lane, j] = free_blocks[free_top[0]]


@cuda.jit(device=True)
def free_lane(lane, q):
    """Give a lane's KV blocks (on the GPU and in the host arena) back and empty the lane."""
    release_blocks(lane, 0, q.block_tables, q.free_blocks, q.free_top)
    release_blocks(lane, 0, q.host_tables, q.host_free_blocks, q.host_free_top)
    q.lanes[lane, L_SYNCED] = 0
    q.lanes[lane, L_ROTATED] = 0
    q.lanes[lane, L_RUNNING] = 0
    q.lanes[lane, L_SLOT] = -1


@cuda.jit(device=True)
def blocks_missing(lane, n, lanes, block_tables, block_size):
    """Blocks ``lane`` must take before it writes its next ``n`` tokens (positions L_CACHED on)."""
    cached = lanes[lane, L_CACHED]
    missing = 0
    for j in range(cached // block_size, (cached + n - 1) // block_size + 1):
        if block_tables[lane, j] < 0:
            missing += 1
    return missing


@cuda.jit(device=True)
def take_blocks(lane, n, lanes, block_tables, free_blocks, free_top, block_size):
    """Pop the blocks ``lane``'s next ``n`` tokens need off the free stack (the caller made sure
    it holds them; a thread per lane may pop at once)."""
    cached = lanes[lane, L_CACHED]
    for j in range(cached // block_size, (cached + n - 1) // block_size + 1):
        if block_tables[lane, j] < 0:
            top = cuda.atomic.sub(free_top, 0, int32(1))
            block_tables[lane, j] = free_blocks[top - 1]


@cuda.jit(device=True)
def newest_holding_blocks(lanes, block_tables):
    """The most recently admitted lane that holds KV blocks (-1: none)."""
    newest = -1
    for s in range(lanes.shape[0]):
        if (lanes[s, L_SLOT] >= 0 and block_tables[s, 0] >= 0
                and (newest < 0 or lanes[s, L_ORDER] > lanes[newest, L_ORDER])):
            newest = s
    return newest


@cuda.jit(device=True)
def preempt_by_recompute(lane, q):
    """Thread 0: drop ``lane``'s K/V. It keeps its lane, its tokens, its seed and its counter,
    and prefills everything it knows again later (engine/scheduler.py's twin): under FCFS as
    soon as blocks allow, under a policy once the policy admits it again (it waits)."""
    release_blocks(lane, 0, q.block_tables, q.free_blocks, q.free_top)
    release_blocks(lane, 0, q.host_tables, q.host_free_blocks, q.host_free_top)  # its mirror
    lanes = q.lanes
    lanes[lane, L_SYNCED] = 0
    lanes[lane, L_CACHED] = 0
    lanes[lane, L_PROMPT] = lanes[lane, L_LEN]
    lanes[lane, L_SCHED] = 0
    lanes[lane, L_RUNNING] = 1 if q.policy[P_CODE] == POLICY_FCFS else 0
    q.sched[S_PREEMPTIONS] += 1


@cuda.jit(device=True)
def grow_decodes_oldest_first(q, block_size, counts):
    """Thread 0, when the free stack cannot give every decode the block it needs: oldest
    admission first, each decode takes its block; while the stack is empty the newest lane that
    holds blocks is preempted (maybe the asker itself, which then runs nothing this step).
    ``counts[0]`` (decodes this step) loses the decodes preempted; ``counts[2]`` becomes 1.
    Returns -1 when done, or a victim to rotate out (its host blocks reserved): the caller's
    threads copy it out (``rotate``) and call again."""
    lanes, block_tables = q.lanes, q.block_tables
    while True:
        asker = -1
        for s in range(lanes.shape[0]):
            if (lanes[s, L_SCHED] == 1 and blocks_missing(s, 1, lanes, block_tables, block_size) > 0
                    and (asker < 0 or lanes[s, L_ORDER] < lanes[asker, L_ORDER])):
                asker = s
        if asker < 0:
            return -1
        while q.free_top[0] == 0 and lanes[asker, L_SCHED] == 1:
            victim = newest_holding_blocks(lanes, block_tables)  # the asker holds some
            counts[0] -= lanes[victim, L_SCHED]  # a decode of this step, or a prompt lane
            counts[2] = 1
            lanes[victim, L_SCHED] = 0
            if lanes[victim, L_CACHED] > 0 and reserve_host_blocks(victim, q):
                return victim
            preempt_by_recompute(victim, q)
        if lanes[asker, L_SCHED] == 1:
            take_blocks(asker, 1, lanes, block_tables, q.free_blocks, q.free_top, block_size)


# --- rotation: a lane's KV to the host arena and back (preemption="rotate") ---------------------
@cuda.jit(device=True)
def reserve_host_blocks(lane, q):
    """Thread 0: host-arena blocks for every GPU block ``lane`` holds that has no copy there
    yet (its dirty blocks, after its L_SYNCED ones; into q.host_tables). False if the arena
    lacks them (or there is none: preemption by recompute)."""
    synced, n = blocks_held(lane, q.host_tables), blocks_held(lane, q.block_tables)
    if n - synced > q.host_free_top[0]:
        return False
    take_range(lane, synced, n, q.host_tables, q.host_free_blocks, q.host_free_top)
    return True


@cuda.jit(device=True)
def copy_block(src, src_row, dst, dst_row, thread, n_threads):
    """One KV block, row ``src_row`` of ``src`` to row ``dst_row`` of ``dst`` (float32 words;
    one side is the host arena, across PCIe), by ``n_threads`` threads: each loads COPY_UNROLL
    words -- a warp's loads side by side, so coalesced -- before it stores any. A load from
    mapped host memory takes a PCIe round trip (~1-2 µs): a thread that stored each word before
    loading the next kept one load in flight, and block 0 alone read rotated blocks back at a
    few hundred MB/s."""
    words = src.shape[1]
    buffer = cuda.local.array(COPY_UNROLL, float32)
    for base in range(0, words, n_threads * COPY_UNROLL):
        for u in range(COPY_UNROLL):
            i = base + u * n_threads + thread
            if i < words:
                buffer[u] = src[src_row, i]
        for u in range(COPY_UNROLL):
            i = base + u * n_threads + thread
            if i < words:
                dst[dst_row, i] = buffer[u]


@cuda.jit(device=True)
def copy_lane_blocks(lane, first, src_tables, src, dst_tables, dst):
    """Every thread of the block: ``lane``'s blocks from entry ``first`` on, from ``src`` to
    ``dst`` (rows of block words), block j of ``src_tables``'s row to block j of
    ``dst_tables``'s."""
    for j in range(first, blocks_held(lane, src_tables)):
        copy_block(src, src_tables[lane, j], dst, dst_tables[lane, j], cuda.threadIdx.x, THREADS)


@cuda.jit(device=True)
def rotate(lane, q, state, out, block_size):
    """Block 0, every thread: copy ``lane``'s KV to the host blocks reserved for it (``out``:
    only its dirty blocks, those after its L_SYNCED ones, which are there already) or all of
    it back into the GPU blocks taken for it; then thread 0 gives the blocks it left back to
    their free stack. Out, it keeps its lane and its tokens (L_ROTATED), and a request that
    was decoding shows as DECODE_PAUSED in the ring (``state``: the slots' state words) until
    it is back; in, it runs on from where it stopped, its full blocks' host copies kept
    (Synced: a later rotate-out skips them) and its last, partial one's given back (it will
    change)."""
    lanes = q.lanes
    if out:
        copy_lane_blocks(lane, lanes[lane, L_SYNCED], q.block_tables, q.kv_blocks, q.host_tables,
                         q.host_kv)
        cuda.threadfence_system()  # the copy is in host memory before the GPU blocks are reused
    else:
        copy_lane_blocks(lane, 0, q.host_tables, q.host_kv, q.block_tables, q.kv_blocks)
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        if out:
            q.sched[S_BLOCKS_OUT] += blocks_held(lane, q.block_tables) - lanes[lane, L_SYNCED]
            release_blocks(lane, 0, q.block_tables, q.free_blocks, q.free_top)
        else:
            q.sched[S_BLOCKS_IN] += blocks_held(lane, q.host_tables)
            release_blocks(lane, lanes[lane, L_CACHED] // block_size, q.host_tables,
                           q.host_free_blocks, q.host_free_top)
        lanes[lane, L_SYNCED] = blocks_held(lane, q.host_tables)
        q.lanes[lane, L_ROTATED] = 1 if out else 0
        q.lanes[lane, L_RUNNING] = 0 if out else 1
        if q.lanes[lane, L_GEN] > 0:  # (one still in its prompt stays PREFILL_PROCESSING)
            store_release(state, q.lanes[lane, L_SLOT], DECODE_PAUSED if out else DECODE_PROCESSING)
        q.sched[S_ROTATIONS if out else S_ROTATE_INS] += 1
        if out:
            q.sched[S_PREEMPTIONS] += 1
    cuda.syncthreads()


@cuda.jit(device=True)
def lane_to_rotate_in(q, block_size):
    """Thread 0: the oldest rotated-out lane, with GPU blocks taken for its cached tokens, if the
    pool holds them besides the next token of every decoding lane (FCFS: if the oldest does not
    fit, nobody overtakes it); else -1."""
    lanes = q.lanes
    oldest = -1
    reserve = 0
    for s in range(lanes.shape[0]):
        if lanes[s, L_SLOT] < 0:
            continue
        if lanes[s, L_ROTATED] == 1:
            if oldest < 0 or lanes[s, L_ORDER] < lanes[oldest, L_ORDER]:
                oldest = s
        elif lanes[s, L_CACHED] >= lanes[s, L_PROMPT]:
            reserve += blocks_missing(s, 1, lanes, q.block_tables, block_size)
    if oldest < 0:
        return -1
    if (lanes[oldest, L_LEN] + block_size - 1) // block_size + reserve > q.free_top[0]:
        return -1
    take_blocks_to_rotate_in(oldest, q)
    return oldest


@cuda.jit(device=True)
def take_blocks_to_rotate_in(lane, q):
    """Thread 0: GPU blocks for each host block of a rotated-out ``lane`` (the caller made sure
    the stack holds them)."""
    take_range(lane, 0, blocks_held(lane, q.host_tables), q.block_tables, q.free_blocks,
               q.free_top)


# --- RotaSched in the kernel: a policy decides who runs (policy other than FCFS) -----------------
NO_ROOM = -2  # an admission the pool has no blocks for: the rest of the decision waits


@cuda.jit(device=True)
def lane_group(lanes, s):
    """Which of the policy's lists lane ``s`` is in: 0 running, 1 waiting, 2 rotated out (-1: an
    empty lane)."""
    if lanes[s, L_SLOT] < 0:
        return -1
    if lanes[s, L_RUNNING] == 1:
        return 0
    return 2 if lanes[s, L_ROTATED] == 1 else 1


@cuda.jit(device=True)
def seconds(ns):
    """A lane's host-clock time in seconds; NaN for -1 (not yet)."""
    return math.nan if ns < 0 else ns * 1e-9


@cuda.jit(device=True)
def describe_lanes(q, block_size, sizes):
    """Block 0: ``count_lane_groups``, then ``list_lanes``."""
    count_lane_groups(q.lanes, sizes)
    list_lanes(q, block_size, sizes)


@cuda.jit(device=True)
def count_lane_groups(lanes, sizes):
    """Block 0: ``sizes`` (4,) shared = the lanes running, waiting and rotated out, then all
    of them (a thread per lane)."""
    tid = cuda.threadIdx.x
    if tid == 0:
        for g in range(4):
            sizes[g] = 0
    cuda.syncthreads()
    for s in range(tid, lanes.shape[0], THREADS):
        g = lane_group(lanes, s)
        if g >= 0:
            cuda.atomic.add(sizes, g, 1)
    cuda.syncthreads()
    if tid == 0:
        sizes[3] = sizes[0] + sizes[1] + sizes[2]
    cuda.syncthreads()


@cuda.jit(device=True)
def list_lanes(q, block_size, sizes):
    """Block 0: every lane holding a request as one column of the policy's arrays, in FCFS
    order — running (in order of admission), then waiting, then rotated out, each in arrival
    order (engine/policy_step.py's ``describe``; a thread per lane finds its column by counting
    the lanes before it). ``sizes``: ``count_lane_groups``'."""
    tid = cuda.threadIdx.x
    lanes, ints, floats = q.lanes, q.decide_ints, q.decide_floats
    S = lanes.shape[0]
    for s in range(tid, S, THREADS):
        g = lane_group(lanes, s)
        if g < 0:
            continue
        col = 0
        for k in range(g):
            col += sizes[k]
        for t in range(S):
            if lane_group(lanes, t) == g and lanes[t, L_ORDER] < lanes[s, L_ORDER]:
                col += 1
        known = lanes[s, L_LEN]  # tokens known: every one needs K/V once it runs
        held = blocks_held(s, q.block_tables)
        ints[D_LANE, col] = s
        ints[D_STATE, col] = RUNNING if g == 0 else (WAITING if g == 1 else ROTARY)
        ints[D_HELD, col] = held
        ints[D_TO_RUN, col] = max(0, (known + block_size - 1) // block_size - held)
        ints[D_ON_HOST, col] = blocks_held(s, q.host_tables) if g == 2 else 0
        floats[D_T_ARR, col] = seconds(lanes[s, L_ARRIVAL_NS])
        floats[D_T_RUN, col] = seconds(lanes[s, L_RUN_NS])
        floats[D_T_LAST, col] = seconds(lanes[s, L_LAST_NS])
    cuda.syncthreads()


@cuda.jit(device=True)
def decide(q, n, now_ns, answer):
    """Block 0: the policy's decision over the ``n`` requests ``describe_lanes`` listed
    (sched/device_policy.py's ``decide_step``, the host policies' twin): LVF's ranking by every
    thread (``rank_by_vlt``), the rest by thread 0. ``answer`` (2,) shared: how many it admits
    and preempts (indices in decide_ints[D_ADMIT], [D_PREEMPT])."""
    ints, floats, p = q.decide_ints, q.decide_floats, q.policy
    now = now_ns * 1e-9
    if int32(p[P_CODE]) == POLICY_LVF:
        rank_by_vlt(ints[D_STATE, :n], floats[D_T_ARR, :n], floats[D_T_RUN, :n],
                    floats[D_T_LAST, :n], now, p[P_ALPHA], p[P_BETA_F], p[P_TTFT_SLO_S],
                    p[P_BETA_B], p[P_TBT_SLO_S], floats[D_VLT, :n], ints[D_ORDER, :n])
    if cuda.threadIdx.x != 0:
        return
    num_admitted, num_preempted, _ = decide_step(
        int32(p[P_CODE]), ints[D_STATE, :n], floats[D_T_ARR, :n], floats[D_T_RUN, :n],
        floats[D_T_LAST, :n], ints[D_HELD, :n], ints[D_TO_RUN, :n], ints[D_ON_HOST, :n],
        now, q.free_top[0], int32(p[P_MAX_RUNNING]), p[P_ALPHA], p[P_BETA_F],
        p[P_TTFT_SLO_S], p[P_BETA_B], p[P_TBT_SLO_S], int32(p[P_TRANSFER_BUDGET]),
        floats[D_VLT, :n], ints[D_ORDER, :n], ints[D_ADMIT, :n], ints[D_PREEMPT, :n])
    answer[0] = num_admitted
    answer[1] = num_preempted
    q.sched[S_DECISIONS] += 1


@cuda.jit(device=True)
def policy_victim(lane, q):
    """Thread 0: a running lane the policy preempts. Nothing cached: back to waiting (a
    recompute that loses nothing). Else rotated out: returns the lane, its host blocks reserved
    — unless the host arena has no room, and then it keeps running (-1): recomputing instead
    would trade a copy for its whole context in model work (engine/policy_step.py's
    ``preempt``)."""
    if q.lanes[lane, L_RUNNING] == 0:
        return -1
    if q.lanes[lane, L_CACHED] == 0:
        preempt_by_recompute(lane, q)
        return -1
    return lane if reserve_host_blocks(lane, q) else -1


@cuda.jit(device=True)
def policy_admit(lane, q, now_ns, seats):
    """Thread 0: a lane the policy admits, taking one of the batch's ``seats`` (seats[0]: the
    lanes running). Rotated out: GPU blocks for its KV, and the lane to rotate in — or NO_ROOM
    if the pool lacks them. Waiting: into the batch from now on (its t_run); -1. NO_ROOM too
    if the batch is full (a victim the host arena had no room for kept its place): the step's
    buffers hold max_num_seqs sampled rows."""
    lanes = q.lanes
    if seats[0] >= q.policy[P_MAX_RUNNING]:
        return NO_ROOM
    if lanes[lane, L_ROTATED] == 1:
        if blocks_held(lane, q.host_tables) > q.free_top[0]:
            return NO_ROOM
        take_blocks_to_rotate_in(lane, q)
        seats[0] += 1
        return lane
    lanes[lane, L_RUNNING] = 1
    lanes[lane, L_RUN_NS] = now_ns
    seats[0] += 1
    return -1


@cuda.jit(device=True)
def rotasched_step(q, state, block_size):
    """Block 0, at the head of a step under a policy: describe the lanes, and on a decision
    step (every P_DECISION_INTERVAL-th, and whenever nothing runs; in between the batch stands
    and FCFS's growth rules preempt) decide, then carry the decision out: its rotate-outs first
    (their blocks are what its admissions count on), then its admissions in order, each
    rotate-in copied back by the block (engine/policy_step.py's ``apply``)."""
    tid = cuda.threadIdx.x
    sizes = cuda.shared.array(4, int32)
    answer = cuda.shared.array(2, int32)
    moving = cuda.shared.array(1, int32)  # the lane block 0 copies now
    now = cuda.shared.array(1, int64)  # the decision's time, one for every thread
    count_lane_groups(q.lanes, sizes)
    if sizes[3] == 0 or (q.sched[S_STEPS] % int64(q.policy[P_DECISION_INTERVAL]) != 0
                         and sizes[0] > 0):
        return  # not a decision step: the lanes are listed only when the policy decides
    list_lanes(q, block_size, sizes)
    if tid == 0:
        now[0] = globaltimer_ns() + q.sched[S_CLOCK_OFFSET]
    cuda.syncthreads()
    decide(q, sizes[3], now[0], answer)
    cuda.syncthreads()
    ints = q.decide_ints
    for k in range(answer[1]):
        if tid == 0:
            moving[0] = policy_victim(ints[D_LANE, ints[D_PREEMPT, k]], q)
        cuda.syncthreads()
        if moving[0] >= 0:
            rotate(moving[0], q, state, True, block_size)
        cuda.syncthreads()
    count_lane_groups(q.lanes, sizes)  # the rotate-outs done: sizes[0], the seats taken
    for k in range(answer[0]):
        if tid == 0:
            moving[0] = policy_admit(ints[D_LANE, ints[D_ADMIT, k]], q, now[0], sizes)
        cuda.syncthreads()
        if moving[0] == NO_ROOM:
            break
        if moving[0] >= 0:
            rotate(moving[0], q, state, False, block_size)
        cuda.syncthreads()
    cuda.syncthreads()


# --- B: schedule (block 0) ----------------------------------------------------------------------


@cuda.jit(device=True)
def complete_slot(slot, reason, state, finish_reason):
    """The reason first, then the state the frontend polls for (DECODE_COMPLETED: theirs now)."""
    store_release(finish_reason, slot, reason)
    store_release(state, slot, DECODE_COMPLETED)


@cuda.jit(device=True)
def finish_cancelled(q, cancel, state, finish_reason):
    """Cancelled lanes (running or rotated out) give everything back and complete (ABORT)."""
    for lane in range(cuda.threadIdx.x, q.lanes.shape[0], THREADS):
        slot = q.lanes[lane, L_SLOT]
        if slot >= 0 and load_acquire(cancel, slot) != 0:
            free_lane(lane, q)
            complete_slot(slot, FINISH_ABORT, state, finish_reason)


@cuda.jit(device=True)
def admit_candidates(state, arrival_ns, claim_ns, prompt_len, max_tokens, seed, temperature,
                     top_p, top_k, stop_ids, ignore_eos, prompt_tokens, finish_reason, lanes,
                     lane_sampling, lane_stop_ids, block_tables, free_blocks, free_top, sched,
                     control, candidates, vocab_size, output_tokens_width, max_model_len,
                     block_size, budget, fcfs, ring_in_device_memory):
    """Claim noted slots oldest first while a lane is free — under FCFS (``fcfs``) and the KV
    blocks of their first prompt chunk too; under a policy the lane waits for the policy to
    admit it (thread 0 decides; the block checks each prompt's token ids in parallel). False if
    one had to wait."""
    tid = cuda.threadIdx.x
    verdict = cuda.shared.array(1, int32)  # ADMIT, ERROR, WAIT (no room) or SKIP (not pending)
    n_cand = min(sched[S_CANDIDATES], MAX_CANDIDATES)
    for k in range(n_cand):
        if tid == 0:
            oldest_first(candidates, k, n_cand, arrival_ns)
            slot = candidates[k]
            verdict[0] = ADMIT
            if load_acquire(state, slot) != PREFILL_PENDING:
                verdict[0] = SKIP
            elif request_error(slot, prompt_len, max_tokens, temperature, top_p, top_k,
                               prompt_tokens.shape[1], output_tokens_width, max_model_len,
                               free_blocks.shape[0], block_size):
                verdict[0] = ERROR
        cuda.syncthreads()
        slot = candidates[k]
        if verdict[0] == ADMIT:  # every prompt token must be a real token id
            for i in range(tid, prompt_len[slot], THREADS):
                if prompt_tokens[slot, i] < 0 or prompt_tokens[slot, i] >= vocab_size:
                    verdict[0] = ERROR
        cuda.syncthreads()
        if tid == 0 and verdict[0] != SKIP:
            verdict[0] = place_request(slot, verdict[0], state, arrival_ns, claim_ns, prompt_len,
                                       max_tokens,
                                       seed, temperature, top_p, top_k, stop_ids, ignore_eos,
                                       finish_reason, lanes, lane_sampling, lane_stop_ids,
                                       free_top, sched, control, block_size, budget, fcfs,
                                       ring_in_device_memory)
        cuda.syncthreads()
        if verdict[0] == WAIT:
            return False  # FCFS: nobody overtakes the oldest request that does not fit
    return True


ADMIT, ERROR, WAIT, SKIP = 0, 1, 2, 3


@cuda.jit(device=True)
def oldest_first(candidates, k, n, arrival_ns):
    """Swap the oldest of candidates[k:n] into position k (one step of a selection sort)."""
    best = k
    for j in range(k + 1, n):
        if arrival_ns[candidates[j]] < arrival_ns[candidates[best]]:
            best = j
    candidates[k], candidates[best] = candidates[best], candidates[k]


@cuda.jit(device=True)
def request_error(slot, prompt_len, max_tokens, temperature, top_p, top_k, max_prompt,
                  max_output, max_model_len, num_blocks, block_size):
    """True if the slot's scalar fields are out of range (the frontend is not trusted: a bad
    size must not overrun an arena), or if the request would not fit the whole KV pool alone
    (it would wait forever: the last sampled token needs no K/V)."""
    n, m = prompt_len[slot], max_tokens[slot]
    return (n < 1 or n > max_prompt or m < 1 or m > max_output or n + m > max_model_len
            or (n + m - 1 + block_size - 1) // block_size > num_blocks
            or not temperature[slot] >= 0 or not (0 < top_p[slot] <= 1) or top_k[slot] < 0)


@cuda.jit(device=True)
def claim_slot(state, slot, ring_in_device_memory):
    """PREFILL_PENDING -> PREFILL_PROCESSING; True if this thread made the move."""
    if ring_in_device_memory:
        return cuda.atomic.cas(state, slot, PREFILL_PENDING, PREFILL_PROCESSING) == PREFILL_PENDING
    if load_acquire(state, slot) != PREFILL_PENDING:
        return False
    store_release(state, slot, PREFILL_PROCESSING)
    return True


@cuda.jit(device=True)
def place_request(slot, verdict, state, arrival_ns, claim_ns, prompt_len, max_tokens, seed,
                  temperature, top_p, top_k, stop_ids, ignore_eos, finish_reason, lanes,
                  lane_sampling, lane_stop_ids, free_top, sched, control, block_size, budget, fcfs,
                  ring_in_device_memory):
    """Thread 0: claim ``slot`` and give it a lane (its blocks come as its tokens need them:
    ``plan_step``). Returns the final verdict."""
    lane = -1
    for s in range(lanes.shape[0]):
        if lanes[s, L_SLOT] < 0:
            lane = s
            break
    n = prompt_len[slot]
    first_chunk = (min(n, budget) + block_size - 1) // block_size  # blocks it takes first
    if verdict == ADMIT and (lane < 0 or (fcfs and first_chunk > free_top[0])):
        return WAIT
    if not claim_slot(state, slot, ring_in_device_memory):
        return SKIP
    now = globaltimer_ns() + sched[S_CLOCK_OFFSET]
    claim_ns[slot] = now
    sched[S_CLAIMED] += 1
    store_release(control, C_CLAIMED, sched[S_CLAIMED])
    if verdict == ERROR:
        complete_slot(slot, FINISH_ERROR, state, finish_reason)
        return ERROR
    lanes[lane, L_SLOT] = slot
    lanes[lane, L_CACHED] = 0
    lanes[lane, L_LEN] = n
    lanes[lane, L_PROMPT] = n
    lanes[lane, L_RING_PROMPT] = n
    lanes[lane, L_ROTATED] = 0
    lanes[lane, L_RUNNING] = 1 if fcfs else 0  # under a policy it waits to be admitted
    lanes[lane, L_ARRIVAL_NS] = arrival_ns[slot]
    lanes[lane, L_RUN_NS] = now if fcfs else -1
    lanes[lane, L_LAST_NS] = -1
    lanes[lane, L_GEN] = 0
    lanes[lane, L_ORDER] = sched[S_ADMITTED]
    lanes[lane, L_SEED] = seed_of(seed[slot], slot)
    copy_request_to_lane(slot, lane, lanes, lane_sampling, lane_stop_ids, temperature, top_p,
                         top_k, stop_ids, ignore_eos, max_tokens)
    sched[S_ADMITTED] += 1
    return ADMIT


@cuda.jit(device=True)
def copy_request_to_lane(slot, lane, lanes, lane_sampling, lane_stop_ids, temperature, top_p,
                         top_k, stop_ids, ignore_eos, max_tokens):
    """Thread 0, at admission: the request's sampling parameters and stop rules, read from the
    ring once, so that no later step has to reach across PCIe for them."""
    lanes[lane, L_LAST_TOKEN] = -1
    lanes[lane, L_MAX_TOKENS] = max_tokens[slot]
    lanes[lane, L_IGNORE_EOS] = ignore_eos[slot]
    lanes[lane, L_TOP_K] = top_k[slot]
    lane_sampling[lane, 0] = temperature[slot]
    lane_sampling[lane, 1] = top_p[slot]
    for j in range(lane_stop_ids.shape[1]):
        lane_stop_ids[lane, j] = stop_ids[slot, j]


@cuda.jit(device=True)
def plan_step(q, state, budget, block_size):
    """Block 0: how many tokens each lane runs this step (lanes[:, L_SCHED]), where they go in the
    flat batch (L_START) and which lanes sample (L_SAMPLE_ROW), each lane taking the KV blocks
    its tokens need: rotated-out lanes back in first (oldest first, while they fit), then
    decodes (a thread per lane; the executor makes sure S <= budget; when the pool runs short,
    thread 0 preempts: ``grow_decodes_oldest_first``), then prompt chunks oldest first (thread
    0), then places and rows in lane order (a block-wide scan); ``state``: the ring's state
    words, where a rotated-out decode shows as DECODE_PAUSED. Returns whether any lane has
    prompt left."""
    tid = cuda.threadIdx.x
    lanes = q.lanes
    S = lanes.shape[0]
    # decoding lanes, lanes with prompt tokens left, blocks the decodes lack (then: whether
    # this step preempted), whether the stack holds every block the decodes lack, lanes still
    # rotated out
    counts = cuda.shared.array(5, int32)
    moving = cuda.shared.array(1, int32)  # the lane whose KV block 0 copies now (-1: none)
    scratch = cuda.shared.array(THREADS, int32)
    fcfs = q.policy[P_CODE] == POLICY_FCFS
    if fcfs:
        while True:  # rotate lanes back in
            if tid == 0:
                moving[0] = lane_to_rotate_in(q, block_size)
            cuda.syncthreads()
            if moving[0] < 0:
                break
            rotate(moving[0], q, state, False, block_size)
    else:
        rotasched_step(q, state, block_size)
    if tid == 0:
        for k in range(5):
            counts[k] = 0
    cuda.syncthreads()
    for s in range(tid, S, THREADS):
        lanes[s, L_SCHED] = 0
        lanes[s, L_SAMPLE_ROW] = -1
        if lanes[s, L_SLOT] < 0:
            continue
        if lanes[s, L_ROTATED] == 1:
            cuda.atomic.add(counts, 4, 1)
        if lanes[s, L_RUNNING] == 0:
            continue
        if lanes[s, L_CACHED] >= lanes[s, L_PROMPT]:
            lanes[s, L_SCHED] = 1  # decoding: one token, always caught up afterwards
            cuda.atomic.add(counts, 0, 1)
            cuda.atomic.add(counts, 2,
                            int32(blocks_missing(s, 1, lanes, q.block_tables, block_size)))
        else:
            cuda.atomic.add(counts, 1, 1)
    cuda.syncthreads()
    if tid == 0:
        counts[3] = counts[2] <= q.free_top[0]
        counts[2] = 0  # from here: whether this step preempted
    cuda.syncthreads()
    if counts[3]:  # the usual case: every decode takes the block it lacks, in parallel
        for s in range(tid, S, THREADS):
            if lanes[s, L_SCHED] == 1:
                take_blocks(s, 1, lanes, q.block_tables, q.free_blocks, q.free_top, block_size)
    else:
        while True:  # oldest first, preempting the newest; each rotate-out copied by the block
            if tid == 0:
                moving[0] = grow_decodes_oldest_first(q, block_size, counts)
            cuda.syncthreads()
            if moving[0] < 0:
                break
            rotate(moving[0], q, state, True, block_size)
    cuda.syncthreads()
    prompts_left = counts[1] > 0
    if tid == 0 and prompts_left:
        start_new = counts[2] == 0 and (counts[4] == 0 or not fcfs)
        schedule_prompt_chunks(lanes, counts[0], budget, start_new, q.block_tables,
                               q.free_blocks, q.free_top, block_size)
    cuda.syncthreads()
    n_tokens = int64(0)
    n_rows = int64(0)
    for base in range(0, S, THREADS):  # every thread runs the same number of rounds
        s = base + tid
        n = lanes[s, L_SCHED] if s < S else 0
        samples = s < S and n > 0 and lanes[s, L_CACHED] + n == lanes[s, L_LEN]  # caught up
        tokens_before, tokens_here = block_exclusive_sum(int32(n), scratch)
        rows_before, rows_here = block_exclusive_sum(int32(1 if samples else 0), scratch)
        if s < S:
            lanes[s, L_START] = n_tokens + tokens_before
            if samples:
                lanes[s, L_SAMPLE_ROW] = n_rows + rows_before
        n_tokens += tokens_here
        n_rows += rows_here
    if tid == 0:
        q.sched[S_TOKENS] = n_tokens
        q.sched[S_ROWS] = n_rows
    plan_mirror(q, block_size, scratch)  # (its barriers: fill_step reads every lane's place)
    return prompts_left


# --- DuplexKV: full blocks copied out eagerly, in the step's spare time -----------------------------
@cuda.jit(device=True)
def plan_mirror(q, block_size, scratch):
    """Block 0, once the step is planned: DuplexKV's eager copy-out (SuperInfer §4). Each
    running lane's full blocks with no host copy yet -- from L_SYNCED up to L_CACHED // B,
    written by earlier steps, so this step's forward pass leaves them alone -- get a host block
    each, in lane order (a block-wide scan over what each lane wants), up to MAX_MIRROR_BLOCKS a
    step and while the arena keeps more free blocks than the GPU pool has (a rotate-out of
    everything still fits). The pairs go to ``mirror_pairs`` and the copies to spare threads
    (``copy_mirror``), done before the next step; the blocks count as Synced from now on, so a
    later rotate-out copies only the dirty tail. Without a host arena, or in a step that runs
    nothing (or stops the kernel), nothing."""
    tid = cuda.threadIdx.x
    lanes = q.lanes
    S = lanes.shape[0]
    room = min(MAX_MIRROR_BLOCKS, q.host_free_top[0] - q.free_blocks.shape[0])  # may be <= 0
    if q.sched[S_TOKENS] == 0 or q.sched[S_STOP] != 0:
        room = 0  # a step that runs nothing copies nothing either
    top = q.host_free_top[0]
    wanted = int32(0)  # blocks wanted by the lanes of earlier rounds
    for base in range(0, S, THREADS):  # every thread runs the same number of rounds
        s = base + tid
        want = 0
        if s < S and lanes[s, L_SLOT] >= 0 and lanes[s, L_RUNNING] == 1:
            want = max(0, lanes[s, L_CACHED] // block_size - lanes[s, L_SYNCED])
        before, here = block_exclusive_sum(int32(want), scratch)
        for i in range(want):
            k = wanted + before + i  # this block's place in the step's list
            if k >= room:
                break
            j = lanes[s, L_SYNCED]
            host = q.host_free_blocks[top - 1 - k]
            q.host_tables[s, j] = host
            q.mirror_pairs[0, k] = q.block_tables[s, j]
            q.mirror_pairs[1, k] = host
            lanes[s, L_SYNCED] = j + 1
        wanted += here
    cuda.syncthreads()  # every thread read the stack's top before thread 0 lowers it
    if tid == 0:
        n = max(0, min(wanted, room))
        q.host_free_top[0] = top - n
        q.sched[S_MIRROR_COUNT] = n
        q.sched[S_BLOCKS_MIRRORED] += n
    cuda.syncthreads()


@cuda.jit(device=True)
def copy_mirror(q, thread, n_threads):
    """This thread's share of the step's eager copies (``plan_mirror``'s pairs), GPU pool to
    host arena; called by threads with nothing else to do (the inline kernel's blocks other
    than 0 while block 0 publishes, the graph dispatcher's threads other than the launcher's
    while the forward graph runs)."""
    for k in range(q.sched[S_MIRROR_COUNT]):
        copy_block(q.kv_blocks, q.mirror_pairs[0, k], q.host_kv, q.mirror_pairs[1, k], thread,
                   n_threads)
    cuda.threadfence_system()


@cuda.jit(device=True)
def schedule_prompt_chunks(lanes, n_tokens, budget, start_new, block_tables, free_blocks,
                           free_top, block_size):
    """Thread 0: prompt chunks into what the decodes left of the budget, oldest admission first,
    each taking its KV blocks, up to the first chunk the free stack cannot hold (FCFS: nobody
    overtakes it). Unless ``start_new``, only prompts already part-way continue (a step that
    preempted starts none, nor does one while a lane is rotated out: the host scheduler's
    rules)."""
    S = lanes.shape[0]
    while n_tokens < budget:
        oldest = -1
        for s in range(S):
            if (lanes[s, L_SLOT] >= 0 and lanes[s, L_SCHED] == 0
                    and lanes[s, L_CACHED] < lanes[s, L_PROMPT] and lanes[s, L_RUNNING] == 1
                    and (start_new or lanes[s, L_CACHED] > 0)
                    and (oldest < 0 or lanes[s, L_ORDER] < lanes[oldest, L_ORDER])):
                oldest = s
        if oldest < 0:
            break
        chunk = min(lanes[oldest, L_LEN] - lanes[oldest, L_CACHED], budget - n_tokens)
        if blocks_missing(oldest, chunk, lanes, block_tables, block_size) > free_top[0]:
            break
        take_blocks(oldest, chunk, lanes, block_tables, free_blocks, free_top, block_size)
        lanes[oldest, L_SCHED] = chunk
        n_tokens += chunk


@cuda.jit(device=True)
def fill_step(lanes, lane_sampling, prompts_left, prompt_tokens, output_tokens, token_ids,
              positions, seq_rows, logit_rows, step_temperature, step_top_p, step_top_k,
              step_seeds, counters, row_lane):
    """Block 0: write the planned step into the flat-batch arrays. A thread per lane writes its
    decode token (its last one, kept in the lane) and its sample row; then, if prompts are being
    read, the whole block copies each prompt chunk from the ring (host memory), lane by lane —
    from the prompt arena, and past the ring's prompt (a lane refilling its cache after a
    preemption) from the output arena."""
    tid = cuda.threadIdx.x
    S = lanes.shape[0]
    for s in range(tid, S, THREADS):
        n = lanes[s, L_SCHED]
        if n == 0:
            continue
        start = lanes[s, L_START]
        if lanes[s, L_CACHED] >= lanes[s, L_PROMPT]:  # a decode: one token
            token_ids[start] = lanes[s, L_LAST_TOKEN]
            positions[start] = lanes[s, L_CACHED]
            seq_rows[start] = s
        r = lanes[s, L_SAMPLE_ROW]
        if r >= 0:
            logit_rows[r] = start + n - 1
            row_lane[r] = s
            step_temperature[r] = lane_sampling[s, 0]
            step_top_p[r] = lane_sampling[s, 1]
            step_top_k[r] = lanes[s, L_TOP_K]
            step_seeds[r] = lanes[s, L_SEED]
            counters[r] = lanes[s, L_GEN]
    if not prompts_left:
        return
    for s in range(S):  # every thread walks the lanes; the prompt's tokens are spread over them
        n, cached = lanes[s, L_SCHED], lanes[s, L_CACHED]
        if n == 0 or cached >= lanes[s, L_PROMPT]:
            continue
        slot, start, ring_prompt = lanes[s, L_SLOT], lanes[s, L_START], lanes[s, L_RING_PROMPT]
        for j in range(tid, n, THREADS):
            p = cached + j
            token_ids[start + j] = (prompt_tokens[slot, p] if p < ring_prompt
                                    else output_tokens[slot, p - ring_prompt])
            positions[start + j] = p
            seq_rows[start + j] = s


@cuda.jit(device=True)
def seed_of(seed, slot):
    """The request's seed (low 32 bits, as the reference uses it), or, when it names none, one
    drawn from the GPU clock."""
    if seed >= 0:
        return int64(seed & 0xFFFFFFFF)
    return int64(lowbias32(globaltimer_ns() ^ int64(slot)))


# --- C: forward (every block): executors/forward_ops.py ------------------------------------------


# --- D: publish (block 0) -----------------------------------------------------------------------
@cuda.jit(device=True)
def publish(q, tokens, row_lane, R, state, output_tokens, generated, first_token_ns,
            last_token_ns, finish_reason, max_model_len, now_ns):
    """Thread per sampled row: the token into the arena, then ``generated`` (release), then the
    state; the stop rules; a finished lane gives its blocks back. Then every lane's progress.
    Returns how many lanes are in the running batch afterwards, and how many hold a request
    outside it (waiting for a policy, or rotated out)."""
    tid = cuda.threadIdx.x
    lanes = q.lanes
    for s in range(tid, lanes.shape[0], THREADS):  # what this step cached
        lanes[s, L_CACHED] += lanes[s, L_SCHED]
    cuda.syncthreads()
    for r in range(tid, R, THREADS):
        lane = row_lane[r]
        slot, n, token = lanes[lane, L_SLOT], lanes[lane, L_GEN], tokens[r]
        output_tokens[slot, n] = token
        last_token_ns[slot] = now_ns
        if n == 0:
            first_token_ns[slot] = now_ns
        store_release(generated, slot, n + 1)  # the frontend reads up to here
        if n == 0:
            store_release(state, slot, DECODE_PROCESSING)
        lanes[lane, L_GEN] = n + 1
        lanes[lane, L_LEN] += 1
        lanes[lane, L_LAST_TOKEN] = token
        lanes[lane, L_LAST_NS] = now_ns
        reason = stop_reason(token, lane, lanes, q.lane_stop_ids, q.eos_ids, max_model_len)
        if reason != 0:
            free_lane(lane, q)
            complete_slot(slot, reason, state, finish_reason)
    counts = cuda.shared.array(2, int32)  # lanes in the running batch, lanes outside it
    if tid == 0:
        counts[0] = 0
        counts[1] = 0
    cuda.syncthreads()
    for s in range(tid, lanes.shape[0], THREADS):
        if lanes[s, L_SLOT] >= 0:
            cuda.atomic.add(counts, 0 if lanes[s, L_RUNNING] == 1 else 1, 1)
    cuda.syncthreads()
    return counts[0], counts[1]


@cuda.jit(device=True)
def stop_reason(token, lane, lanes, lane_stop_ids, eos_ids, max_model_len):
    """FINISH_STOP for EOS (unless ignored) or a stop id; FINISH_LENGTH at max_tokens or the
    context limit; 0 to go on. (The same rules as the host scheduler's ``postprocess``.)"""
    for j in range(lane_stop_ids.shape[1]):
        if lane_stop_ids[lane, j] == token:
            return FINISH_STOP
    if lanes[lane, L_IGNORE_EOS] == 0:
        for j in range(eos_ids.shape[0]):
            if eos_ids[j] == token:
                return FINISH_STOP
    if lanes[lane, L_GEN] >= lanes[lane, L_MAX_TOKENS] or lanes[lane, L_LEN] >= max_model_len:
        return FINISH_LENGTH
    return 0


# --- the phases, shared by both dispatchers ---------------------------------------------------
@cuda.jit(device=True)
def read_host_words(ring, control, scheduler):
    """A (block 0): the host's words, all loads in flight at once. The doorbell snapshot: a
    frontend makes its slot PENDING before it rings, so a scan sees every slot rung so far."""
    r, q = ring, scheduler
    sched = q.sched
    if cuda.threadIdx.x == 0:
        sched[S_STEP_START] = globaltimer_ns()
        sched[S_DOORBELL_NOW] = load_acquire(r.doorbell, 0)
        sched[S_STOP] = load_acquire(control, C_STOP)
        sched[S_BEATS] += 1
        store_release(r.engine_heartbeat, 0, sched[S_BEATS])  # the frontend's /health
    finish_cancelled(q, r.cancel, r.state, r.finish_reason)


@cuda.jit(device=True)
def schedule_step(ring, control, scheduler, step, row_lane, vocab_size, budget, max_model_len,
                  block_size, ring_in_device_memory):
    """B (block 0): admit what the scan noted, plan the step, write its flat batch (``step``, a
    forward_ops.StepBuffers; ``row_lane`` (S,): each sampled row's lane)."""
    r, q, b = ring, scheduler, step
    sched = q.sched
    tid = cuda.threadIdx.x
    if tid == 0 and sched[S_CANDIDATES] > 0:
        sched[S_SCANS] += 1
        sched[S_SCAN_NS] = globaltimer_ns() - sched[S_SCAN_START]
    if admit_candidates(r.state, r.arrival_ns, r.claim_ns, r.prompt_len, r.max_tokens, r.seed,
                        r.temperature, r.top_p, r.top_k, r.stop_ids, r.ignore_eos,
                        r.prompt_tokens, r.finish_reason, q.lanes, q.lane_sampling,
                        q.lane_stop_ids, q.block_tables, q.free_blocks, q.free_top, sched,
                        control, q.candidates, vocab_size, r.output_tokens.shape[1],
                        max_model_len, block_size, budget, q.policy[P_CODE] == POLICY_FCFS,
                        ring_in_device_memory):
        if tid == 0 and sched[S_CANDIDATES] <= MAX_CANDIDATES:
            sched[S_DOORBELL_SEEN] = sched[S_DOORBELL_NOW]  # all admitted: no rescan
    cuda.syncthreads()
    if tid == 0:
        sched[S_CANDIDATES] = 0
    prompts_left = plan_step(q, r.state, budget, block_size)
    fill_step(q.lanes, q.lane_sampling, prompts_left, r.prompt_tokens, r.output_tokens,
              b.token_ids, b.positions, b.seq_rows, b.logit_rows, b.step_temperature,
              b.step_top_p, b.step_top_k, b.step_seeds, b.counters, row_lane)


@cuda.jit(device=True)
def publish_step(ring, control, scheduler, tokens, row_lane, R, max_model_len):
    """D (block 0): publish the step's R tokens (``tokens`` (R,), sampled for lanes
    ``row_lane`` (R,)), then the counters the host reads."""
    r, q = ring, scheduler
    publish_start = globaltimer_ns()
    running, waiting = publish(q, tokens, row_lane, R, r.state, r.output_tokens, r.generated,
                               r.first_token_ns, r.last_token_ns, r.finish_reason,
                               max_model_len, publish_start + q.sched[S_CLOCK_OFFSET])
    if cuda.threadIdx.x == 0:
        count_step(q, control, running, waiting, publish_start)


@cuda.jit(device=True)
def idle(sched):
    """Nothing to run: count it and nap (thread 0), so that an idle ring costs little power."""
    if cuda.threadIdx.x == 0:
        sched[S_IDLE] += 1
        pause_ns(IDLE_SLEEP_NS)


# --- the kernel (inline dispatch) ---------------------------------------------------------------
@cuda.jit
def persistent_scheduler_kernel(ring, control, model, step, scheduler, history, budget,
                                max_model_len, ring_in_device_memory):
    """The loop of the module docstring. Its arguments are named groups of device arrays: the
    ring (``RingArrays``), the host's control words (``control`` (NUM_CONTROL_WORDS,) i64,
    mapped), the model (``forward_ops.ModelArrays``), the step's arrays
    (``forward_ops.StepBuffers``), the scheduler's state (``SchedulerState``) and what the
    sampler reads of each request's history (``forward_ops.SamplingHistory``)."""
    tid = cuda.threadIdx.x
    leader = cuda.blockIdx.x == 0
    sched = scheduler.sched
    while True:
        if leader:  # A
            read_host_words(ring, control, scheduler)
        grid_sync()
        # every block decides from the same snapshot: all of them scan (and meet after), or none
        if sched[S_DOORBELL_NOW] != sched[S_DOORBELL_SEEN]:
            if leader and tid == 0:
                sched[S_SCAN_START] = globaltimer_ns()
            scan_ring(ring.state, sched, scheduler.candidates, cuda.blockIdx.x * THREADS + tid,
                      cuda.gridDim.x * THREADS)
            grid_sync()
        if leader:  # B
            schedule_step(ring, control, scheduler, step, history.row_lane, model.embed.shape[0],
                          budget, max_model_len, model.kv_pool.shape[3], ring_in_device_memory)
        grid_sync()
        if sched[S_STOP] != 0:
            return
        T, R = sched[S_TOKENS], sched[S_ROWS]
        if T == 0:
            if leader:
                idle(sched)
            continue
        if leader and tid == 0:  # C: forward (every block)
            sched[S_FORWARD_START] = globaltimer_ns()
        forward(T, R, model, step, history)
        grid_sync()
        if leader:  # D
            publish_step(ring, control, scheduler, step.tokens, history.row_lane, R,
                         max_model_len)
        if cuda.gridDim.x == 1:  # the eager copies: block 0 after publishing (the simulator) ...
            copy_mirror(scheduler, tid, THREADS)
        elif not leader:  # ... or every other block meanwhile
            copy_mirror(scheduler, (cuda.blockIdx.x - 1) * THREADS + tid,
                        (cuda.gridDim.x - 1) * THREADS)


@cuda.jit(device=True)
def count_step(q, control, running, waiting, publish_start):
    """Thread 0 of block 0, after a step: the counters the host reads. Plain stores, then one
    release of the step count: a host that sees the new count sees the rest."""
    sched = q.sched
    sched[S_STEPS] += 1
    sched[S_SCHEDULE_NS] += sched[S_FORWARD_START] - sched[S_STEP_START]
    sched[S_FORWARD_NS] += publish_start - sched[S_FORWARD_START]
    sched[S_PUBLISH_NS] += globaltimer_ns() - publish_start
    control[C_RUNNING] = running
    control[C_WAITING] = waiting
    control[C_DECISIONS] = sched[S_DECISIONS]
    control[C_BLOCKS_OUT] = sched[S_BLOCKS_OUT]
    control[C_BLOCKS_IN] = sched[S_BLOCKS_IN]
    control[C_BLOCKS_MIRRORED] = sched[S_BLOCKS_MIRRORED]
    control[C_FREE_BLOCKS] = q.free_top[0]
    control[C_HOST_FREE_BLOCKS] = q.host_free_top[0]
    control[C_SCAN_NS] = sched[S_SCAN_NS]
    control[C_SCANS] = sched[S_SCANS]
    control[C_SCHEDULE_NS] = sched[S_SCHEDULE_NS]
    control[C_FORWARD_NS] = sched[S_FORWARD_NS]
    control[C_PUBLISH_NS] = sched[S_PUBLISH_NS]
    control[C_PREEMPTIONS] = sched[S_PREEMPTIONS]
    control[C_ROTATIONS] = sched[S_ROTATIONS]
    control[C_ROTATE_INS] = sched[S_ROTATE_INS]
    store_release(control, C_STEPS, sched[S_STEPS])
