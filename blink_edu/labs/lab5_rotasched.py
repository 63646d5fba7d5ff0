"""Lab 5 — RotaSched: Virtual Lag Time and the Largest-VLT-First decision.

Read first: ``notebooks/labs/lab5_rotasched.ipynb`` and the docstrings of
``blink_edu/sched/vlt.py`` (the formula) and ``blink_edu/sched/policies.py`` (``StepView``,
``RequestView``, ``Decision`` and the promise every policy keeps). Check your work with::

    python -m blink_edu.labs check 5

Every scheduler iteration the caller describes its live requests as plain numbers
(``StepView``: ``now``, ``free_blocks``, ``max_num_seqs`` and ``requests``, a list of
``RequestView`` in FCFS order) and a policy answers with a ``Decision``: whom to admit, whom to
preempt. Your policy (``blink_edu.labs.plug.lab5.LabLVF``) drives the discrete-event simulator of
``blink_edu.sim`` — the very loop that compares SuperInfer's policies on a GH200 or an H200 —
and the tests compare its decisions, step by step, with the project's.

States (``sched/vlt.py``): ``WAITING`` (queued, no KV on the GPU), ``RUNNING``, ``ROTARY`` (its KV
rotated out to host memory; it waits to come back).
"""

from __future__ import annotations

import math  # noqa: F401 - for your code

from ..sched.policies import Decision, RequestView, StepView  # noqa: F401 - what you work with
from ..sched.vlt import ROTARY, RUNNING, WAITING, RotaSchedConfig  # noqa: F401


# --- Lab 5.1 ------------------------------------------------------------------------------------
def vlt(request: RequestView, now: float, config: RotaSchedConfig) -> float:
    """Virtual Lag Time of one request at time ``now`` (seconds): how far it lags its SLO.

    * RUNNING: ``-(now - t_run)`` with ``t_run = request.run_start_time`` (<= 0: the longer it
      has run, the further ahead it is);
    * WAITING: ``max(0, now - t_arr - config.beta_f * config.ttft_slo_s)`` with
      ``t_arr = request.arrival_time``;
    * ROTARY: ``config.alpha * max(0, now - t_last - config.beta_b * config.tbt_slo_s)`` with
      ``t_last = request.last_token_time`` — or its arrival time if it has no token yet
      (``last_token_time`` is NaN then: test with ``math.isnan``).
    """
    # TODO: Lab 5.1
    raise NotImplementedError("Lab 5.1: vlt")


# --- Lab 5.2 ------------------------------------------------------------------------------------
def rank_by_vlt(view: StepView, config: RotaSchedConfig) -> list:
    """Every request of ``view.requests``, largest VLT (at ``view.now``) first. Requests with
    equal VLT keep their order in ``view.requests`` (FCFS): a *stable* sort (Python's ``sorted``
    is stable)."""
    # TODO: Lab 5.2
    raise NotImplementedError("Lab 5.2: rank_by_vlt")


# --- Lab 5.3 ------------------------------------------------------------------------------------
def lvf_decide(view: StepView, config: RotaSchedConfig) -> Decision:
    """Largest-VLT-First (SuperInfer §3). Let ``running`` be the RUNNING requests (in view
    order), ``candidates`` the others, ``growth`` the sum of the running ones' ``blocks_to_run``
    and ``seats = view.max_num_seqs - len(running)``.

    1. **Enough memory: plain FCFS.** If ``sum(c.blocks_to_run for c in candidates) + growth <=
       view.free_blocks`` and ``len(candidates) <= seats``: admit every candidate, in view
       order, preempt nobody: ``Decision(admit=[ids], fcfs_fallback=True)``.
    2. Otherwise rank everyone with ``rank_by_vlt``.
    3. **Admit from the head.** ``capacity = view.free_blocks + config.transfer_budget_blocks -
       growth`` (rotating requests out this iteration may free up to the transfer budget), but
       never more than ``view.free_blocks - growth + preemptable`` where ``preemptable`` is the
       sum of ``blocks_held + blocks_to_run`` over the running requests. Walk the ranking; skip
       running requests; admit a candidate if its ``blocks_to_run <= capacity`` (then
       ``capacity -= blocks_to_run``); stop at the first that does not fit.
    4. **Preempt from the tail.** ``deficit = (blocks_to_run of the admitted) + growth -
       view.free_blocks``. Walk the running requests from the *end* of the ranking (most
       negative VLT: running the longest): stop as soon as ``deficit <= 0`` and ``len(running) -
       len(preempted) + len(admitted) <= view.max_num_seqs``; otherwise preempt it and
       ``deficit -= blocks_held + blocks_to_run``.
    5. **Seats.** While ``len(running) - len(preempted) + len(admitted) > view.max_num_seqs``,
       drop the last admitted.

    Return ``Decision(admit=[ids of admitted, in order], preempt_rotary=[ids of preempted, in
    order], vlt={request_id: its VLT})``.
    """
    # TODO: Lab 5.3
    raise NotImplementedError("Lab 5.3: lvf_decide")
