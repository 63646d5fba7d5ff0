"""Talking to other agents from inside a kernel: acquire loads, release stores, the GPU clock.

Blink §3 (the persistent scheduler polls a ring buffer that the frontend writes) and docs/design.md §5
("Polling"). A kernel that never returns must read words that *someone else* — the host, another
process — keeps changing, and must publish its own results so that they see them in order.
Ordinary loads and stores do not promise either:

* a plain load in a spin loop is a loop-invariant to the compiler, which hoists it out: the loop
  then spins forever on the first value it read. Even ``ld.volatile`` / ``cuda.ldcv`` was hoisted.
* a reader that sees a new ``generated`` counter must also see the token written before it. Two
  plain stores may become visible to the host in any order.

PTX's memory model names the fix: ``ld.acquire.sys`` (no later access of this thread moves above
it, and it sees the latest value anywhere in the *system*, host included) and ``st.release.sys``
(no earlier access moves below it). We emit them as inline assembly marked as having side effects,
so the compiler keeps every one of them in place.

``globaltimer_ns`` reads the GPU's nanosecond clock (``%globaltimer``), so the kernel can stamp a
token's time without the host.

In Numba's simulator these are plain Python: every simulated thread is a Python thread, loads and
stores are already in program order, and the clock is ``time.monotonic_ns``.
"""

from __future__ import annotations

import time

from ..backend import get_backend

cuda = get_backend().cuda

if get_backend().is_simulator:

    @cuda.jit(device=True)
    def load_acquire(array, i):
        """array[i], with every later access of this thread ordered after it."""
        return array[i]

    @cuda.jit(device=True)
    def store_release(array, i, value):
        """array[i] = value, after every earlier access of this thread is visible."""
        array[i] = value

    @cuda.jit(device=True)
    def globaltimer_ns():
        return time.monotonic_ns()

    @cuda.jit(device=True)
    def pause_ns(ns):
        """Let other threads run for about ``ns`` (an idle persistent kernel naps between polls)."""
        time.sleep(ns * 1e-9)

else:
    from llvmlite import ir
    from numba import types, uint32
    from numba.cuda.cache_hints import _get_element_pointer  # numba-cuda's own helper
    from numba.cuda.extending import intrinsic

    _REGISTER = {32: "r", 64: "l"}  # PTX operand constraint for a 32- / 64-bit integer

    def _check(array):
        if not isinstance(array, types.Array) or array.dtype.bitwidth not in _REGISTER:
            raise TypeError(f"acquire/release need an array of 32- or 64-bit words, got {array}")

    @intrinsic
    def load_acquire(typingctx, array, index):
        _check(array)

        def codegen(context, builder, sig, args):
            array_type, index_type = sig.args
            ptr = _get_element_pointer(context, builder, index_type, args[1], array_type, args[0])
            bits = array_type.dtype.bitwidth
            word = context.get_value_type(array_type.dtype)
            asm = ir.InlineAsm(ir.FunctionType(word, [word.as_pointer()]),
                               f"ld.acquire.sys.global.b{bits} $0, [$1];",
                               f"={_REGISTER[bits]},l,~{{memory}}", side_effect=True)
            return builder.call(asm, [ptr])

        return array.dtype(array, index), codegen

    @intrinsic
    def store_release(typingctx, array, index, value):
        _check(array)

        def codegen(context, builder, sig, args):
            array_type, index_type, value_type = sig.args
            ptr = _get_element_pointer(context, builder, index_type, args[1], array_type, args[0])
            bits = array_type.dtype.bitwidth
            word = context.get_value_type(array_type.dtype)
            cast = context.cast(builder, args[2], value_type, array_type.dtype)
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [word.as_pointer(), word]),
                               f"st.release.sys.global.b{bits} [$0], $1;",
                               f"l,{_REGISTER[bits]},~{{memory}}", side_effect=True)
            builder.call(asm, [ptr, cast])
            return context.get_dummy_value()

        return types.void(array, index, value), codegen

    @intrinsic
    def globaltimer_ns(typingctx):
        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(ir.IntType(64), []), "mov.u64 $0, %globaltimer;",
                               "=l", side_effect=True)
            return builder.call(asm, [])

        return types.int64(), codegen

    @cuda.jit(device=True)
    def pause_ns(ns):
        """Let other warps run for about ``ns`` (an idle persistent kernel naps between polls)."""
        cuda.nanosleep(uint32(ns))


@cuda.jit
def read_globaltimer(out):
    """out[0] = the GPU clock (for lining it up with the host's ``time.monotonic_ns``)."""
    out[0] = globaltimer_ns()


@cuda.jit
def clock_handshake(words):
    """One thread, ``words`` in mapped host memory: wait for the host's go (words[0] != 0), read
    the GPU clock into words[1], say done (words[2] = 1). The GPU's reading then lies between the
    host's clock just before its go and just after it sees done: a PCIe round trip apart."""
    while load_acquire(words, 0) == 0:
        pause_ns(100)
    words[1] = globaltimer_ns()
    store_release(words, 2, 1)


@cuda.jit
def spin_for_ns(duration):
    """Keep one thread busy for ``duration`` ns: holds a stream so work can queue up behind it."""
    start = globaltimer_ns()
    while globaltimer_ns() - start < duration:
        pause_ns(1000)
