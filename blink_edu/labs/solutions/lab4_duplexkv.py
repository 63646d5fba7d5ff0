"""Lab 4 reference solution (instructors only)."""

from __future__ import annotations

from ...kv.block_manager import DIRTY, SYNCED  # noqa: F401


def mark_written(states, table: list[int], old_tokens: int, new_tokens: int,
                 block_size: int) -> list[int]:
    full_before, full_now = old_tokens // block_size, new_tokens // block_size
    newly_full = [table[i] for i in range(full_before, full_now)]
    for blk in newly_full:
        states[blk] = SYNCED
    return newly_full


def on_written(mirrored: set, pending_out: set, old_tokens: int, new_tokens: int,
               block_size: int) -> None:
    first = old_tokens // block_size
    touched_end = -(-new_tokens // block_size)
    for i in range(first, touched_end):
        mirrored.discard(i)
    for i in range(first, new_tokens // block_size):
        pending_out.add(i)


def blocks_to_rotate_out(num_blocks: int, mirrored: set) -> list[int]:
    return [i for i in range(num_blocks) if i not in mirrored]


def plan_batched_copy(gpu_blocks: list[int], host_blocks: list[int]) -> list[tuple[int, list[int]]]:
    pairs = sorted(zip(host_blocks, gpu_blocks), key=lambda hg: hg[0])
    runs: list[tuple[int, list[int]]] = []
    prev_host = None
    for host, gpu in pairs:
        if prev_host is not None and host == prev_host + 1:
            runs[-1][1].append(gpu)
        else:
            runs.append((host, [gpu]))
        prev_host = host
    return runs
