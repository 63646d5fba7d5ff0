"""The pinned host arena's allocator: consecutive runs, deferred frees while copies fly."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blink_edu.kv.host_store import HostKVStore, OutOfHostBlocks, consecutive_runs


def store(n=8):
    return HostKVStore(n, (1, 2, 2, 1, 4), np.float32)


def test_allocate_prefers_one_consecutive_run():
    host = store()
    first = host.allocate(3)
    assert first.tolist() == [0, 1, 2]
    host.allocate(2)  # 3, 4
    host.free([1])
    assert host.allocate(2).tolist() == [5, 6]  # not [1, 5]: a run exists
    assert host.allocate(2).tolist() == [1, 7]  # no run of 2 left: the lowest free
    with pytest.raises(OutOfHostBlocks):
        host.allocate(1)


def test_free_waits_for_copies_in_flight():
    host = store()
    ids = host.allocate(2)
    host.begin_transfer(ids)
    host.free(ids)
    assert host.num_free == 6  # not yet
    host.end_transfer(ids)
    assert host.num_free == 8
    host.check()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 30), max_size=20).map(lambda v: np.unique(np.asarray(v, np.int32))))
def test_consecutive_runs_cover_the_ids_in_order(ids):
    runs = consecutive_runs(ids)
    rebuilt = [int(ids[offset]) + k for offset, count in runs for k in range(count)]
    assert rebuilt == ids.tolist()
    assert all(int(ids[o + c - 1]) + 1 != int(ids[o2]) for (o, c), (o2, _) in zip(runs, runs[1:]))
