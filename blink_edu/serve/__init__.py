"""The OpenAI-compatible server: ``python -m blink_edu.serve`` (DESIGN.md §2, §8; Blink §3).

``app`` (HTTP + SSE, the paper's DPU frontend) talks to the engine only through the ring;
``stream`` is one request's submit -> poll -> detokenize loop; ``engine_process`` is the engine's
side; ``launcher`` starts both and stops them; ``protocol`` is the wire format; ``metrics`` and
``health`` are what the server tells its operator. Kept import-light on purpose: the spawned
engine process imports this package and must not pull in the web stack.
"""
