"""Benchmarks: each compares variants side by side in one run and writes bench/results/<name>.json.

Speed lives here, never in timed tests (DESIGN.md §7, §9). Every results file carries the
machine, the commit, the configuration, every raw figure and a ``summary`` of headline ratios.
"""
