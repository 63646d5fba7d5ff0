"""Hand-made requests for the policy tests (host and device): plain numbers a test can read."""

from __future__ import annotations

from blink_edu.sched import RUNNING, RequestView


def request_view(rid, state, now=10.0, **kw):
    """A request that arrived a second before ``now``; a waiting or rotary one needs 2 blocks to
    run, a running one holds 4 and needs none more. ``kw`` overrides any field."""
    base = dict(arrival_time=now - 1.0, blocks_to_run=2)
    if state == RUNNING:
        base.update(run_start_time=now - 1.0, blocks_held=4, blocks_to_run=0)
    base.update(kw)
    return RequestView(request_id=rid, state=state, **base)
