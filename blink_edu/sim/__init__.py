"""A discrete-event simulator for scheduling policies (docs/design.md §8; SuperInfer §3–§5).

``costs`` (step and transfer time), ``presets`` (a model on a machine), ``workload`` (seeded
Poisson / log-normal requests), ``simulator`` (the event loop running ``blink_edu.sched``
policies), ``metrics`` (SLO attainment, P99 TTFT / TBT), ``sweep`` (policies x rates).
"""

from .costs import BandwidthCurve, CostModel
from .presets import PRESETS, Preset, get_preset
from .simulator import SimRequest, SimResult, SimulationStalled, Simulator, simulate
from .workload import LengthModel, RequestSpec, poisson_workload

__all__ = ["BandwidthCurve", "CostModel", "PRESETS", "Preset", "get_preset", "SimRequest",
           "SimResult", "SimulationStalled", "Simulator", "simulate", "LengthModel",
           "RequestSpec", "poisson_workload"]
