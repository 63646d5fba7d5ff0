"""The layout kernel (kernels/kv_layout.py) in the simulator against NumPy fancy indexing."""

from __future__ import annotations

import numpy as np
import pytest

from blink_edu.backend import get_backend
from blink_edu.kernels import kv_layout

cuda = get_backend().cuda


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_gather_then_scatter_match_fancy_indexing(rng, dtype):
    pool = rng.standard_normal((7, 2, 2, 4, 1, 8)).astype(dtype)  # (N, L, 2, B, K, E)
    ids = rng.permutation(7)[:4].astype(np.int32)  # (n,) distinct blocks, any order
    device_pool = cuda.to_device(pool)
    pool_rows = kv_layout.as_rows(device_pool)  # (N, W) 64-bit words
    assert pool_rows.dtype == np.uint64
    staging = cuda.device_array((6, pool_rows.shape[1]), pool_rows.dtype)  # room for more than n
    kv_layout.gather_blocks(pool_rows, cuda.to_device(ids), staging)
    gathered = staging.copy_to_host()[:4].view(dtype).reshape(4, *pool.shape[1:])
    np.testing.assert_array_equal(gathered, pool[ids])

    fresh = rng.standard_normal((4, *pool.shape[1:])).astype(dtype)  # (n, L, 2, B, K, E)
    targets = rng.permutation(7)[:4].astype(np.int32)
    kv_layout.scatter_blocks(cuda.to_device(np.ascontiguousarray(kv_layout.as_rows(fresh))),
                             cuda.to_device(targets), pool_rows)
    want = pool.copy()
    want[targets] = fresh
    np.testing.assert_array_equal(device_pool.copy_to_host(), want)


def test_rows_longer_than_one_work_item(rng):
    """A block of more than ROW_CHUNK words is split into several work items."""
    words = kv_layout.ROW_CHUNK + 37
    pool = rng.integers(0, 2**63, size=(3, words), dtype=np.uint64)  # (N, W)
    staging = cuda.device_array((2, words), np.uint64)
    kv_layout.gather_blocks(cuda.to_device(pool), cuda.to_device(np.array([2, 0], np.int32)), staging)
    np.testing.assert_array_equal(staging.copy_to_host(), pool[[2, 0]])


def test_odd_sized_rows_keep_their_dtype():
    blocks = np.zeros((2, 3), np.float16)  # 6 bytes a row: no 64-bit view
    assert kv_layout.as_rows(blocks).dtype == np.float16
