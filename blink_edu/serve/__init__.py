"""The OpenAI-compatible server: ``python -m blink_edu.serve`` (docs/design.md §2, §8; Blink §3).

``app`` (HTTP + SSE, the paper's DPU frontend) talks to the engine only through the ring;
``stream`` is one request's submit -> poll -> detokenize loop; ``launcher`` spawns the engine's
process (its main is ``engine/process.py``, on the engine's side) and stops both; ``protocol`` is the wire format; ``metrics`` and
``health`` are what the server tells its operator. Kept import-light on purpose: the spawned
engine process imports this package and must not pull in the web stack.
"""
