"""Virtual Lag Time (VLT): how far each request lags behind its latency SLO.

SuperInfer §3 (RotaSched: "Virtual Lag Time", an EEVDF-style lag per request); docs/design.md §6.
A request is in one of three states, and each has its own lag:

    running   VLT = -(t_now - t_run)                               (<= 0: the longer it has run,
                                                                    the further *ahead* it is)
    waiting   VLT = ReLU(t_now - t_arr  - beta_F * S_F)            (starts lagging once it has
                                                                    used beta_F of its TTFT SLO)
    rotary    VLT = alpha * ReLU(t_now - t_last - beta_B * S_B)    (its KV is in host memory;
                                                                    lags by its TBT SLO, alpha
                                                                    >= 1 because TBT is tighter)

``t_arr`` arrival, ``t_run`` when it last entered the running state, ``t_last`` the time of its
last token, ``S_F`` the TTFT SLO and ``S_B`` the TBT SLO. Largest-VLT-First (``policies.py``)
runs the most-lagging requests and rotates out the most-advanced ones.

ONE formula, three forms:

* ``vlt_numpy``   — vectorised NumPy over arrays of requests: the oracle, and what the host-side
                    policies (and the simulator) use.
* ``vlt_of``      — a Numba CUDA *device function* for one request, for the persistent scheduler
                    kernel to call; ``vlt_kernel`` is a thin grid-stride kernel over all requests
                    (arrays in, arrays out), and ``vlt_now_kernel`` does the same at the GPU's own
                    clock.
* the clock is ``kernels/sync.py``'s ``globaltimer_ns`` — PTX ``%globaltimer`` through an
                    ``@intrinsic`` on a GPU, ``time.monotonic_ns()`` in Numba's simulator (the
                    persistent scheduler kernel stamps its tokens with the same one).

Times are seconds (float64) everywhere except the raw clock, which is integer nanoseconds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..backend import get_backend
from ..kernels.sync import globaltimer_ns, read_globaltimer

# Request states as small integers, so that a kernel can read them from an int array.
WAITING, RUNNING, ROTARY = 0, 1, 2
STATE_NAMES = {WAITING: "waiting", RUNNING: "running", ROTARY: "rotary"}


@dataclass(frozen=True)
class RotaSchedConfig:
    """All RotaSched parameters (SuperInfer §3 defaults, docs/design.md §6)."""

    alpha: float = 3.0  # weight of a rotary request's lag (>= 1: TBT is the tighter SLO)
    beta_f: float = 0.5  # a waiting request lags after beta_f * S_F seconds
    beta_b: float = 0.0  # a rotary request lags after beta_b * S_B seconds since its last token
    ttft_slo_s: float = 5.0  # S_F
    tbt_slo_s: float = 0.1  # S_B
    transfer_budget_blocks: int = 2400  # B_xfer: KV blocks the link may move per iteration
    # the policy decides every this many iterations; in between the batch stands (1: every
    # iteration, the paper's; more when the host's cost of deciding is a sizeable share of a step)
    decision_interval: int = 1

    def __post_init__(self):
        if self.alpha < 0 or self.beta_f < 0 or self.beta_b < 0:
            raise ValueError(f"alpha, beta_f and beta_b must be >= 0: {self}")
        if self.ttft_slo_s <= 0 or self.tbt_slo_s <= 0:
            raise ValueError(f"SLOs must be positive: {self}")
        if self.transfer_budget_blocks < 0:
            raise ValueError(f"transfer_budget_blocks must be >= 0: {self}")
        if self.decision_interval < 1:
            raise ValueError(f"decision_interval must be >= 1: {self}")

    def replace(self, **changes) -> "RotaSchedConfig":
        return RotaSchedConfig(**{**asdict(self), **changes})

    @property
    def waiting_grace_s(self) -> float:
        """beta_F * S_F: how long a waiting request may wait before it lags."""
        return self.beta_f * self.ttft_slo_s

    @property
    def rotary_grace_s(self) -> float:
        """beta_B * S_B: how long after its last token a rotary request starts to lag."""
        return self.beta_b * self.tbt_slo_s


# --- the oracle: NumPy, vectorised ----------------------------------------------------------------


def vlt_numpy(state, t_now, t_arr, t_run, t_last, config: RotaSchedConfig = RotaSchedConfig()):
    """VLT of every request. ``state`` (N,) int; ``t_arr``, ``t_run``, ``t_last`` (N,) seconds
    (entries a state does not use are ignored, NaN allowed); ``t_now`` a scalar or (N,).
    Returns (N,) float64."""
    state = np.asarray(state)
    t_now = np.asarray(t_now, dtype=np.float64)
    running = -(t_now - np.asarray(t_run, dtype=np.float64))  # (N,)
    waiting = np.maximum(0.0, t_now - np.asarray(t_arr, dtype=np.float64) - config.waiting_grace_s)
    rotary = config.alpha * np.maximum(
        0.0, t_now - np.asarray(t_last, dtype=np.float64) - config.rotary_grace_s)
    # nested where, not np.select: the same choice at a third of the cost for the few dozen
    # requests a policy ranks every step
    return np.where(state == RUNNING, running, np.where(
        state == WAITING, waiting, np.where(state == ROTARY, rotary, np.nan))).astype(np.float64)


# --- the device forms ---------------------------------------------------------------------------

_NAN = float("nan")
_backend = get_backend()
cuda = _backend.cuda


@cuda.jit(device=True)
def vlt_of(state, t_now, t_arr, t_run, t_last, alpha, beta_f, ttft_slo_s, beta_b, tbt_slo_s):
    """VLT of one request (seconds); the same formula as ``vlt_numpy``."""
    if state == RUNNING:
        return -(t_now - t_run)
    if state == WAITING:
        return max(0.0, t_now - t_arr - beta_f * ttft_slo_s)
    if state == ROTARY:
        return alpha * max(0.0, t_now - t_last - beta_b * tbt_slo_s)
    return _NAN  # not a live request


@cuda.jit
def vlt_kernel(state, t_arr, t_run, t_last, t_now, alpha, beta_f, ttft_slo_s, beta_b, tbt_slo_s,
               out):
    """out[i] = VLT of request i at host-given time ``t_now``. state (N,) int32; times (N,) f64."""
    start = cuda.grid(1)
    for i in range(start, state.shape[0], cuda.gridsize(1)):
        out[i] = vlt_of(state[i], t_now, t_arr[i], t_run[i], t_last[i],
                        alpha, beta_f, ttft_slo_s, beta_b, tbt_slo_s)


@cuda.jit
def vlt_now_kernel(state, t_arr, t_run, t_last, clock_origin_ns, alpha, beta_f, ttft_slo_s,
                   beta_b, tbt_slo_s, out, t_now_out):
    """Like ``vlt_kernel`` but at the device's own clock: t_now = (clock - origin) seconds,
    read by each thread and written to ``t_now_out[i]`` (N,) so that callers can check it."""
    start = cuda.grid(1)
    for i in range(start, state.shape[0], cuda.gridsize(1)):
        t_now = (globaltimer_ns() - clock_origin_ns) * 1e-9
        t_now_out[i] = t_now
        out[i] = vlt_of(state[i], t_now, t_arr[i], t_run[i], t_last[i],
                        alpha, beta_f, ttft_slo_s, beta_b, tbt_slo_s)


def _launch_shape(n: int) -> tuple[int, int]:
    """(blocks, threads): tiny in the simulator (each thread is a Python thread)."""
    if _backend.is_simulator:
        return 1, max(1, min(n, 8))
    threads = 128
    return max(1, min(-(-n // threads), 1024)), threads


def _config_args(config: RotaSchedConfig) -> tuple:
    return (float(config.alpha), float(config.beta_f), float(config.ttft_slo_s),
            float(config.beta_b), float(config.tbt_slo_s))


def vlt_on_device(state, t_now: float, t_arr, t_run, t_last,
                  config: RotaSchedConfig = RotaSchedConfig()) -> np.ndarray:
    """Launch ``vlt_kernel`` on host arrays and return (N,) float64 (the kernel's answer)."""
    state = np.ascontiguousarray(state, dtype=np.int32)
    n = state.shape[0]
    out = np.zeros(n, dtype=np.float64)  # (N,)
    if n == 0:
        return out
    arrays = [np.ascontiguousarray(a, dtype=np.float64) for a in (t_arr, t_run, t_last)]
    blocks, threads = _launch_shape(n)
    vlt_kernel[blocks, threads](state, *arrays, float(t_now), *_config_args(config), out)
    return out


def vlt_on_device_now(state, t_arr, t_run, t_last, clock_origin_ns: int,
                      config: RotaSchedConfig = RotaSchedConfig()) -> tuple[np.ndarray, np.ndarray]:
    """Launch ``vlt_now_kernel``; returns (vlt (N,), t_now (N,)) with t_now in seconds since
    ``clock_origin_ns`` on the device clock."""
    state = np.ascontiguousarray(state, dtype=np.int32)
    n = state.shape[0]
    out, t_now = np.zeros(n, dtype=np.float64), np.zeros(n, dtype=np.float64)  # (N,), (N,)
    if n == 0:
        return out, t_now
    arrays = [np.ascontiguousarray(a, dtype=np.float64) for a in (t_arr, t_run, t_last)]
    blocks, threads = _launch_shape(n)
    vlt_now_kernel[blocks, threads](state, *arrays, np.int64(clock_origin_ns),
                                    *_config_args(config), out, t_now)
    return out, t_now


def read_device_clock_ns() -> int:
    """One read of the device clock from the host (launches ``read_globaltimer``)."""
    out = np.zeros(1, dtype=np.int64)
    read_globaltimer[1, 1](out)
    return int(out[0])
