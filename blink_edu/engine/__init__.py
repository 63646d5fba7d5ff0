"""The host engine: sequences, the scheduler, the step loop and the engine process; the executors that run each step live in ``blink_edu/executors/``."""
