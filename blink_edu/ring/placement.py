"""Where the ring lives for a GPU kernel: host memory mapped into the GPU's address space.

Blink §3 (the ring the DPU writes and the GPU polls) and DESIGN.md §4 ("host <-> running
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

CUDA_HOST_REGISTER_PORTABLE = 0x01
CUDA_HOST_REGISTER_MAPPED = 0x02


def _device_view(array: np.ndarray, device_address: int):
    """A Numba device array over ``device_address`` with ``array``'s shape and dtype."""
    cuda = get_backend().cuda
    interface = {"shape": array.shape, "typestr": array.dtype.str, "strides": None,
                 "data": (device_address, False), "version": 3}
    return cuda.from_cuda_array_interface(interface, owner=array, sync=False)


def _simulated_view(array: np.ndarray):
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    return FakeCUDAArray(array)


def map_ring_for_gpu(ring: Ring, names) -> tuple[dict[str, object], bool]:
    """Device views of the ring fields ``names`` (0-d counters become shape (1,)), and whether the
    ring is in device memory (False: mapped host memory). The whole buffer is registered once."""
    buffer = ring.raw  # (bytes,) uint8: every field is a view of it
    if get_backend().is_simulator:
        base = None
    else:
        import cupy

        runtime = cupy.cuda.runtime
        runtime.hostRegister(buffer.ctypes.data, buffer.nbytes,
                             CUDA_HOST_REGISTER_MAPPED | CUDA_HOST_REGISTER_PORTABLE)
        base = runtime.hostGetDevicePointer(buffer.ctypes.data, 0)
    views = {}
    for name in names:
        field = getattr(ring, name)
        field = field.reshape(1) if field.ndim == 0 else field
        if base is None:
            views[name] = _simulated_view(field)
        else:
            views[name] = _device_view(field, base + ring.layout.fields[name].offset)
    return views, False


def unmap_ring(ring: Ring) -> None:
    """Undo ``map_ring_for_gpu`` (after the kernel using it has returned)."""
    if not get_backend().is_simulator:
        import cupy

        cupy.cuda.runtime.hostUnregister(ring.raw.ctypes.data)


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
