"""The engine: sequences, the scheduler, and the executors that run each step (eager, graph, persistent)."""
