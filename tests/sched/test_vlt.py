"""VLT (SuperInfer §3): hand-computed cases, and the CUDA kernel against the NumPy oracle."""

from __future__ import annotations

import time

import numpy as np
import pytest

from blink_edu.sched.vlt import (ROTARY, RUNNING, WAITING, RotaSchedConfig, read_device_clock_ns,
                                 vlt_numpy, vlt_on_device, vlt_on_device_now)

NAN = float("nan")


@pytest.mark.parametrize("state, t_now, t_arr, t_run, t_last, config, expected", [
    # running: -(t_now - t_run), whatever the other times
    (RUNNING, 10.0, 1.0, 4.0, 9.0, RotaSchedConfig(), -6.0),
    (RUNNING, 4.0, 1.0, 4.0, NAN, RotaSchedConfig(), 0.0),
    # waiting: ReLU(t_now - t_arr - beta_F * S_F) = ReLU(4 - 0.5 * 5)
    (WAITING, 10.0, 6.0, NAN, NAN, RotaSchedConfig(), 1.5),
    (WAITING, 10.0, 8.0, NAN, NAN, RotaSchedConfig(), 0.0),  # still within its grace
    (WAITING, 10.0, 6.0, NAN, NAN, RotaSchedConfig(beta_f=0.2, ttft_slo_s=10.0), 2.0),
    # rotary: alpha * ReLU(t_now - t_last - beta_B * S_B) = 3 * 0.5
    (ROTARY, 10.0, 0.0, 2.0, 9.5, RotaSchedConfig(), 1.5),
    (ROTARY, 10.0, 0.0, 2.0, 9.5, RotaSchedConfig(beta_b=1.0), 3 * 0.4),
    (ROTARY, 10.0, 0.0, 2.0, 9.95, RotaSchedConfig(beta_b=1.0), 0.0),
    (ROTARY, 10.0, 0.0, 2.0, 9.0, RotaSchedConfig(alpha=1.0), 1.0),
])
def test_vlt_hand_cases(state, t_now, t_arr, t_run, t_last, config, expected):
    got = vlt_numpy([state], t_now, [t_arr], [t_run], [t_last], config)
    assert got.shape == (1,)
    assert got[0] == pytest.approx(expected)
    on_device = vlt_on_device([state], t_now, [t_arr], [t_run], [t_last], config)
    assert on_device[0] == pytest.approx(expected)


def random_requests(rng, n):
    state = rng.integers(0, 3, size=n).astype(np.int32)  # (N,)
    t_arr = rng.uniform(0, 20, size=n)  # (N,)
    t_run = t_arr + rng.uniform(0, 5, size=n)
    t_last = t_run + rng.uniform(0, 5, size=n)
    return state, t_arr, t_run, t_last


def random_config(rng):
    return RotaSchedConfig(alpha=float(rng.uniform(1, 5)), beta_f=float(rng.uniform(0, 1)),
                           beta_b=float(rng.uniform(0, 2)), ttft_slo_s=float(rng.uniform(1, 8)),
                           tbt_slo_s=float(rng.uniform(0.02, 0.3)))


def test_kernel_matches_numpy(rng):
    n = 13
    state, t_arr, t_run, t_last = random_requests(rng, n)
    config = random_config(rng)
    t_now = float(rng.uniform(30, 40))  # after every t_arr, t_run and t_last (<= 30)
    want = vlt_numpy(state, t_now, t_arr, t_run, t_last, config)
    got = vlt_on_device(state, t_now, t_arr, t_run, t_last, config)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert (got[state == RUNNING] <= 0).all() and (got[state != RUNNING] >= 0).all()


def test_kernel_at_device_clock_matches_numpy(rng):
    n = 9
    state, t_arr, t_run, t_last = random_requests(rng, n)
    config = random_config(rng)
    origin = read_device_clock_ns() - int(30e9)  # "now" is about 30 s after the origin
    got, t_now = vlt_on_device_now(state, t_arr, t_run, t_last, origin, config)
    assert ((t_now > 29.0) & (t_now < 3600.0)).all()
    np.testing.assert_allclose(got, vlt_numpy(state, t_now, t_arr, t_run, t_last, config),
                               rtol=1e-12, atol=1e-9)


def test_device_clock_advances():
    first = read_device_clock_ns()
    time.sleep(0.01)
    second = read_device_clock_ns()
    assert second - first >= 5_000_000  # at least 5 ms of the 10 ms slept


def test_config_rejects_bad_values():
    with pytest.raises(ValueError):
        RotaSchedConfig(alpha=-1)
    with pytest.raises(ValueError):
        RotaSchedConfig(ttft_slo_s=0)
    assert RotaSchedConfig().replace(alpha=2).alpha == 2
    assert RotaSchedConfig().waiting_grace_s == pytest.approx(2.5)
