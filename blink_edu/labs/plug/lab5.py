"""Lab 5's plug: the lab's Largest-VLT-First as a ``sched.policies.Policy``, in the simulator.

``LabLVF`` is a policy like the project's ``LVF`` (same interface, rotary preemption) whose
``decide`` is the lab's ``lvf_decide``. ``blink_edu.sim.Simulator`` runs it over a seeded
workload; ``Recording`` wraps any policy to keep every (view, decision) pair, so the tests can
replay the lab's decisions against the project's, step by step.
"""

from __future__ import annotations

from .. import implementation, require
from ...sched.policies import LVF, Decision, Policy, StepView, make_policy
from ...sched.vlt import RotaSchedConfig
from ...sim import get_preset, poisson_workload, simulate
from ...sim.metrics import summarize

PRESET = "bundled-h200"  # the bundled model on the H200, a 96-block pool: rotation happens
NUM_REQUESTS = 60


class LabLVF(Policy):
    """Largest-VLT-First, decided by the lab's ``lvf_decide``."""

    name = "lab-lvf"
    preemption = "rotary"

    def vlt_of(self, request, now: float) -> float:
        impl = implementation(5)
        require(impl.vlt, "5.1")
        return float(impl.vlt(request, now, self.config))

    def decide(self, view: StepView) -> Decision:
        impl = implementation(5)
        require(impl.lvf_decide, "5.3")
        return impl.lvf_decide(view, self.config)


class Recording(Policy):
    """Any policy, keeping every (view, decision) it made."""

    def __init__(self, inner: Policy):
        super().__init__(inner.config)
        self.inner = inner
        self.name, self.preemption = inner.name, inner.preemption
        self.log: list[tuple[StepView, Decision]] = []

    def decide(self, view: StepView) -> Decision:
        decision = self.inner.decide(view)
        self.log.append((view, decision))
        return decision


def preset_and_config(name: str = PRESET):
    preset = get_preset(name)
    return preset, preset.rotasched_config()


def workload(rate: float, n: int = NUM_REQUESTS, seed: int = 0, preset=None):
    preset = preset or get_preset(PRESET)
    return poisson_workload(n, rate, preset.lengths, seed)


def run(policy: Policy, rate: float, n: int = NUM_REQUESTS, seed: int = 0, preset=None,
        **options):
    """Simulate ``policy`` on the preset at ``rate`` req/s; (result, summary)."""
    preset = preset or get_preset(PRESET)
    result = simulate(preset, policy, workload(rate, n, seed, preset),
                      max_time_s=max(rate and n / rate, 0) + preset.drain_s, **options)
    return result, summarize(result, preset.ttft_slo_s, preset.tbt_slo_s)


def lab_policy(config: RotaSchedConfig | None = None) -> LabLVF:
    return LabLVF(config or preset_and_config()[1])


def project_policy(name: str = "lvf", config: RotaSchedConfig | None = None) -> Policy:
    return make_policy(name, config or preset_and_config()[1])


__all__ = ["LabLVF", "Recording", "LVF", "run", "workload", "lab_policy", "project_policy",
           "preset_and_config"]
