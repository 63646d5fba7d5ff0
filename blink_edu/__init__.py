"""blink_edu: learn how modern LLM serving works by running it.

Two research systems, reimplemented in Python for teaching and for real use:

* Blink — the host CPU leaves the per-token loop: a frontend writes requests into a ring buffer and
  a persistent GPU-resident scheduler kernel batches, runs the model and publishes tokens.
* SuperInfer — under memory pressure, requests' KV blocks rotate between GPU and host memory,
  chosen by Virtual Lag Time (RotaSched) and moved by a full-duplex transfer engine (DuplexKV).

The package follows a request's path: frontend -> ring -> executor -> model -> KV -> policy.
"""

__version__ = "0.1.0"
