"""Course labs: the key mechanisms of Blink and SuperInfer as exercises, run inside the real system.

In the style of MiniTorch and CMU's needle: each lab is a student module with stubs
(``# TODO: Lab N.k`` + ``raise NotImplementedError``), a notebook in ``notebooks/labs/`` that
tells the story with figures, and visible tests in ``tests/labs/test_labN.py`` (marker ``labN``).

=====  =========================  ====================================================================
lab    student module             what you write, and where it runs
=====  =========================  ====================================================================
1      ``lab1_kernels.py``        RMSNorm + GEMV and paged attention as Numba CUDA kernels; the eager
                                  executor launches them to generate real tokens (``plug/lab1.py``)
2      ``lab2_ring.py``           the ring's CAS state machine (host) and the claim / publish of a
                                  persistent polling kernel; a real ring loop and a polling kernel
                                  serve requests with them (``plug/lab2.py``)
3      ``lab3_batching.py``       continuous batching with inline (chunked) prefill under a token
                                  budget; drives ``LLMEngine`` (``plug/lab3.py``)
4      ``lab4_duplexkv.py``       DuplexKV's Dirty/Synced books, eager rotation, the dirty tail and
                                  the batched transfer plan; drives the rotation engine inside
                                  ``LLMEngine`` under memory pressure (``plug/lab4.py``)
5      ``lab5_rotasched.py``      Virtual Lag Time and the Largest-VLT-First decision; drives the
                                  discrete-event simulator of ``blink_edu.sim`` (``plug/lab5.py``)
=====  =========================  ====================================================================

**The switch.** Everything that runs student code asks :func:`implementation` for the lab's
module. By default that is the student's; with ``BLINK_EDU_LAB_SOLUTIONS=1`` in the environment
(or after ``use_solutions()``, or with ``check --solutions``) it is the instructors' reference
solution in ``blink_edu/labs/solutions/`` — which the student handout does not contain. Within
``with substituted(N, module):`` lab N runs ``module`` instead (the instructors' tests check that
every task's tests fail known-wrong answers this way).

Commands::

    python -m blink_edu.labs list               # the labs and their tasks
    python -m blink_edu.labs check N            # run lab N's tests, explain failures, print a score
    python -m blink_edu.labs check N --task N.k # only the tests of one task
    python -m blink_edu.labs handout OUT_DIR    # (instructors, in a clone) the student handout
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType

ENV_VAR = "BLINK_EDU_LAB_SOLUTIONS"
_TRUE = ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Lab:
    number: int
    module: str  # the student module in blink_edu/labs/ (and its twin in solutions/)
    title: str
    notebook: str  # in notebooks/labs/
    tasks: dict  # "N.k" -> what to write


LABS: dict[int, Lab] = {
    1: Lab(1, "lab1_kernels", "Kernels: fused RMSNorm + GEMV, paged attention", "lab1_kernels.ipynb", {
        "1.1": "inv_rms: the RMSNorm scale of one row (a device function)",
        "1.2": "rmsnorm_gemv_kernel: out (+)= rms_norm(x) @ W.T + b, one thread per output",
        "1.3": "paged_attention_kernel: causal attention through block tables, one thread per "
               "(token, head)",
    }),
    2: Lab(2, "lab2_ring", "The ring buffer: CAS state machine, claim and publish", "lab2_ring.ipynb", {
        "2.1": "slot_cas: the host's compare-and-swap on a slot's state word, legal moves only",
        "2.2": "claim_slot: the polling kernel claims a PREFILL_PENDING slot with an atomic CAS",
        "2.3": "publish_token: arena first, then the counter, then the state",
    }),
    3: Lab(3, "lab3_batching", "Continuous batching with inline prefill", "lab3_batching.ipynb", {
        "3.1": "schedule_decodes: one token per running sequence, oldest first, preempting the "
               "newest when the KV pool is full",
        "3.2": "prompt_chunk: how much of a prompt fits this step",
        "3.3": "schedule_prompts: finish the partial prompt, then admit waiting prompts FCFS",
    }),
    4: Lab(4, "lab4_duplexkv", "DuplexKV: eager rotation and batched transfers", "lab4_duplexkv.ipynb", {
        "4.1": "mark_written: DIRTY -> SYNCED when a block fills",
        "4.2": "on_written: stale host copies and the eager copy-out queue",
        "4.3": "blocks_to_rotate_out: what a rotate-out still has to move (the dirty tail)",
        "4.4": "plan_batched_copy: one copy per run of consecutive host blocks",
    }),
    5: Lab(5, "lab5_rotasched", "RotaSched: Virtual Lag Time and Largest-VLT-First", "lab5_rotasched.ipynb", {
        "5.1": "vlt: Virtual Lag Time of one request",
        "5.2": "rank_by_vlt: every request, largest VLT first, FCFS among ties",
        "5.3": "lvf_decide: the Largest-VLT-First decision",
    }),
}

_override: bool | None = None
_substitutes: dict[int, ModuleType] = {}  # lab -> a module checked in place of the student's


def use_solutions(enabled: bool | None = True) -> bool | None:
    """Use the reference solutions (True), the student's code (False), or whatever the
    environment says (None) — for this process, whatever ``BLINK_EDU_LAB_SOLUTIONS`` is.
    Returns the choice it replaces."""
    global _override
    before, _override = _override, enabled
    return before


def solutions_enabled() -> bool:
    """Whether :func:`implementation` hands out the reference solutions."""
    if _override is not None:
        return _override
    return os.environ.get(ENV_VAR, "0").strip().lower() in _TRUE


def solutions_available() -> bool:
    """True in the instructors' repository, False in a student handout."""
    return importlib.util.find_spec(f"{__name__}.solutions") is not None


@contextmanager
def substituted(lab: int, module: ModuleType):
    """Within the block, lab ``lab`` runs ``module`` (any module with the lab's functions: a
    known-wrong variant, a student's copy) instead of the student's code or the solutions."""
    if lab not in LABS:
        raise ValueError(f"there is no lab {lab}; labs: {', '.join(map(str, LABS))}")
    before = _substitutes.get(lab)
    _substitutes[lab] = module
    try:
        yield module
    finally:
        if before is None:
            del _substitutes[lab]
        else:
            _substitutes[lab] = before


def implementation(lab: int) -> ModuleType:
    """The module whose functions lab ``lab`` runs: the student's, or the reference solution
    (see the module docstring), or what :func:`substituted` put in their place."""
    if lab in _substitutes:
        return _substitutes[lab]
    module = LABS[lab].module
    if solutions_enabled():
        if not solutions_available():
            raise RuntimeError(f"{ENV_VAR}=1 asks for the reference solutions, but this copy "
                               f"(a student handout) has none: unset {ENV_VAR} to run your code")
        return importlib.import_module(f"{__name__}.solutions.{module}")
    return importlib.import_module(f"{__name__}.{module}")


def student_file(lab: int) -> str:
    """Where the student writes lab ``lab``: ``blink_edu/labs/labN_*.py``."""
    return f"blink_edu/labs/{LABS[lab].module}.py"


def which() -> str:
    """"solutions" or "student": what :func:`implementation` returns now."""
    return "solutions" if solutions_enabled() else "student"


def require(function, task: str) -> None:
    """Raise NotImplementedError if ``function`` (a student function or kernel) is still the
    untouched stub of ``task``. Kernels are checked on the host *before* a launch: on a GPU a
    ``raise`` inside a kernel is not reported, the kernel would just write nothing."""
    py = getattr(function, "py_func", None) or getattr(function, "fn", None) or function
    code = getattr(py, "__code__", None)
    if code is not None and "NotImplementedError" in code.co_names:
        name = getattr(py, "__name__", str(function))
        raise NotImplementedError(f"Lab {task}: {name} is still a stub (its body raises "
                                  f"NotImplementedError) — write it where it says "
                                  f"'# TODO: Lab {task}'")


__all__ = ["LABS", "Lab", "ENV_VAR", "use_solutions", "solutions_enabled", "solutions_available",
           "implementation", "substituted", "which", "require", "student_file"]
