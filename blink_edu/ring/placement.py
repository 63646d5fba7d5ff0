"""Where the ring lives for a GPU kernel: host memory mapped into the GPU's address space.

Blink §3 (the ring the DPU writes and the GPU polls) and docs/design.md §4 ("host <-> running
persistent kernel round trip: mapped host memory with ld.acquire.sys / st.release.sys, 2.7-3.0 µs
median"). The frontend is an ordinary process with no CUDA at all: it writes the ring in shared
memory with NumPy. The engine *registers* that same memory with the CUDA driver as mapped
(``cudaHostRegister(..., cudaHostRegisterMapped)``) and asks for its device address
(``cudaHostGetDevicePointer``): from then on a kernel's loads and stores of those addresses travel
over PCIe to the very bytes the frontend reads and writes. No copy, no host thread in between.

The other placement — the ring in device memory, written by the frontend with copies on a
non-blocking stream (Blink's one-sided write) — is faster to scan but needs CUDA in the frontend;
``ring_in_device_memory`` is False for everything built here.

In Numba's simulator a kernel's NumPy arguments are *copied* in and back at the end of the launch,
which would hide the frontend's writes from a kernel that never ends: there the same memory is
wrapped as a simulated device array, which the simulator passes through uncopied.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..backend import get_backend
from .layout import Ring


def _simulated_view(array: np.ndarray):
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    return FakeCUDAArray(array)


@dataclass
class RingMapping:
    """The kernel's views of ring fields, and what it takes to undo the mapping."""

    views: dict  # field name -> device array (0-d counters as shape (1,))
    in_device_memory: bool  # False: mapped host memory
    pinned: object = None  # the driver's registration of the buffer (GPU only)

    def release(self) -> None:
        """Unregister the buffer (after the kernel using it has returned)."""
        self.pinned = None  # the driver unpins when the last view of it is gone
        self.views = {}


def map_ring_for_gpu(ring: Ring, names) -> RingMapping:
    """Device views of the ring fields ``names`` over the very bytes the frontend writes. The
    whole buffer is registered once with the driver (``cuMemHostRegister`` with DEVICEMAP, through
    Numba's ``mempin``); each field is a view at its offset."""
    if get_backend().is_simulator:
        views = {name: _simulated_view(_field(ring, name)) for name in names}
        return RingMapping(views, in_device_memory=False)
    from numba.cuda.cudadrv import devicearray

    cuda = get_backend().cuda
    buffer = ring.raw  # (bytes,) uint8: every field is a view of it
    pinned = cuda.current_context().mempin(buffer, buffer.ctypes.data, buffer.nbytes, mapped=True)
    views = {}
    for name in names:
        f = ring.layout.fields[name]
        views[name] = devicearray.from_array_like(
            _field(ring, name), gpu_data=pinned.view(f.offset, f.offset + f.nbytes))
    return RingMapping(views, in_device_memory=False, pinned=pinned)


def _field(ring: Ring, name: str) -> np.ndarray:
    field = getattr(ring, name)
    return field.reshape(1) if field.ndim == 0 else field


@dataclass
class HostWords:
    """A few int64 words in host memory that a kernel can poll and publish: ``host`` (NumPy)
    and ``device`` (the kernel's view of the same bytes)."""

    host: np.ndarray  # (n,) int64
    device: object


def host_words(n: int) -> HostWords:
    if get_backend().is_simulator:
        host = np.zeros(n, np.int64)
        return HostWords(host, _simulated_view(host))
    cuda = get_backend().cuda
    host = cuda.mapped_array(n, np.int64)  # pinned, mapped: the GPU reads and writes it directly
    host[:] = 0
    return HostWords(host, host)
