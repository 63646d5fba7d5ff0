"""Benchmarks: each compares variants side by side in one run and writes ``<out>/<name>.json``.

Speed lives here, never in timed tests (docs/design.md §7, §9). Every results file carries the
machine, the commit, the configuration, every raw figure and a ``summary`` of headline ratios.
``<out>`` is a scratch folder unless ``--out`` names another; ``--out bench/results`` publishes
(``results.py``). This package is a leaf: it uses the engine, the server and the simulator, and
nothing outside it imports it.

    python -m blink_edu.bench.decode        eager and graph executors against HF and the roofline
    python -m blink_edu.bench.persistent    the host out of the loop (GPU only)
    python -m blink_edu.bench.kv_transfer   SuperInfer's Table 1 ladder on this machine's link
    python -m blink_edu.bench.serve         load-test the OpenAI server (vLLM's metrics)
    python -m blink_edu.bench.slo           SLO attainment against rate, simulated or real
"""
