"""Scheduling policies (SuperInfer §3, RotaSched): VLT, Largest-VLT-First and the baselines.

``vlt``: Virtual Lag Time in NumPy (the oracle) and as a Numba CUDA device function + kernel;
``policies``: one ``decide(StepView) -> Decision`` interface for LVF, FCFS (vLLM v1 recompute),
Waiting-First and Swapped-First (vLLM v0).
"""

from .policies import (POLICIES, FCFS, LVF, Decision, Policy, PolicyError, RequestView, StepView,
                       SwappedFirst, WaitingFirst, check_decision, make_policy)
from .vlt import ROTARY, RUNNING, STATE_NAMES, WAITING, RotaSchedConfig, vlt_numpy

__all__ = ["POLICIES", "FCFS", "LVF", "Decision", "Policy", "PolicyError", "RequestView",
           "StepView", "SwappedFirst", "WaitingFirst", "check_decision", "make_policy", "ROTARY",
           "RUNNING", "STATE_NAMES", "WAITING", "RotaSchedConfig", "vlt_numpy"]
