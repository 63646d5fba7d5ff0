"""blink_edu: learn how modern LLM serving works by running it.

Two research systems, reimplemented in Python for teaching and for real use:

* Blink — the host CPU leaves the per-token loop: a frontend writes requests into a ring buffer and
  a persistent GPU-resident scheduler kernel batches, runs the model and publishes tokens.
* SuperInfer — under memory pressure, requests' KV blocks rotate between GPU and host memory,
  chosen by Virtual Lag Time (RotaSched) and moved by a full-duplex transfer engine (DuplexKV).

The package follows a request's path: frontend -> ring -> executor -> model -> KV -> policy
(docs/design.md §2). Its face is vLLM's offline API:

    from blink_edu import LLM, SamplingParams
    outs = LLM().generate(["Once upon a time"], SamplingParams(max_tokens=32))

``LLM`` and the configs are imported on first use, not with the package: importing the engine
chooses the backend (GPU or Numba's simulator, ``backend.py``), which must happen once, and only
for a program that runs the model.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "EngineConfig", "ModelConfig", "__version__"]

#: name -> the module that defines it (imported when the name is first asked for)
_FACE = {"LLM": ".llm", "SamplingParams": ".config", "EngineConfig": ".config",
         "ModelConfig": ".config"}


def __getattr__(name: str):
    if name in _FACE:
        return getattr(importlib.import_module(_FACE[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
