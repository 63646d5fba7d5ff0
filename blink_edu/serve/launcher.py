"""Start the two halves and wire them together: the engine process, the ring, the HTTP frontend.

Blink §3 ("Host loads model + captures CUDA graphs at startup, then exits") and docs/design.md §2, §8.
The lifecycle of ``python -m blink_edu.serve``:

    1. create the ring in shared memory (this process owns it and will unlink it)
    2. spawn the engine process, handing it the ring's *name* and the EngineConfig
    3. serve HTTP (uvicorn) in this process; /health answers 503 until the engine's heartbeat moves
    4. SIGINT / SIGTERM: stop accepting connections, let in-flight requests finish (at most
       ``drain_s`` seconds), then tell the engine to stop, wait for it, unlink the ring
    (meanwhile, if the engine dies, ``supervisor.py`` resets the ring and starts another one,
    with backoff; after ``--max-engine-restarts`` deaths in a row it stops the server, exit 3)

The frontend and the engine share nothing but the ring (its words carry the stop request and
the engine's stats too, see ``ring/control.py``), so the same frontend could drive an engine in another process, on a
GPU, or — in Blink — a persistent kernel that polls the ring from device memory.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
from contextlib import contextmanager
from pathlib import Path

import uvicorn

from ..backend import will_use_gpu
from ..config import PERSISTENT_EXECUTORS, EngineConfig, ModelConfig, resolve_executor
from ..engine.process import run_engine
from ..model.bundled import BUNDLED_DIR, resolve_model_dir
from ..model.tokenizer import Tokenizer
from ..ring.client import RingClient
from ..ring.control import EngineStatsBoard, request_stop
from ..ring.layout import Ring, RingLayout
from .app import ServeSettings, create_app
from .health import EngineWatch
from .supervisor import GAVE_UP_EXIT_STATUS, EngineSupervisor


class EngineProcess:
    """The engine, in a spawned process, and the shared-memory ring it serves."""

    def __init__(self, model_dir: Path, engine_config: EngineConfig, layout: RingLayout):
        self.model_dir, self.engine_config = model_dir, engine_config
        self.ring = Ring.create(layout)
        self.board = EngineStatsBoard(self.ring)
        self.process = self._new_process()

    def _new_process(self):
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: nothing shared by chance
        return ctx.Process(target=run_engine, name="blink_edu-engine", daemon=True,
                           args=(self.ring.name, str(self.model_dir), self.engine_config))

    def start(self) -> EngineWatch:
        self.process.start()
        return EngineWatch(self.ring, self.process.is_alive, self.board.read,
                           pid=self.process.pid)

    @property
    def exitcode(self) -> int | None:
        """The engine process's exit status (negative: the signal that killed it)."""
        return self.process.exitcode

    def reset_ring(self) -> None:
        """Every slot EMPTY again, every counter 0 (the engine must be gone)."""
        if self.process.is_alive():
            raise RuntimeError("the engine is still running: its ring cannot be reset")
        self.process.join()
        self.ring.reset()

    def restart(self):
        """Start a new engine process on the same ring; (its is_alive, its pid)."""
        self.process = self._new_process()
        self.process.start()
        return self.process.is_alive, self.process.pid

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask the engine to stop; force it after ``timeout_s``; then destroy the ring."""
        request_stop(self.ring)
        self.process.join(timeout_s)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.ring.close()
        self.ring.unlink()


class DrainingServer(uvicorn.Server):
    """uvicorn, minus one habit: after its graceful shutdown it re-raises the signal it caught,
    which would kill this process before the engine is stopped and the ring unlinked (and make
    the exit status "killed by SIGTERM" instead of 0). We catch the signals and keep them.
    ``banner``: printed once the port is bound (not before: a port in use is an error)."""

    banner = ""

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started and self.banner:
            print(self.banner, flush=True)

    @contextmanager
    def capture_signals(self):
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def serve(args) -> int:
    """Run the server described by ``__main__``'s flags until a signal stops it."""
    folder = resolve_model_dir(args.model)
    model = ModelConfig.from_folder(folder)
    tokenizer = Tokenizer.from_folder(folder)
    engine_config = EngineConfig(executor=args.executor, num_kv_blocks=args.kv_blocks,
                                 max_num_seqs=args.max_num_seqs, policy=args.policy,
                                 # a policy that rotates needs DuplexKV's host arena
                                 preemption="recompute" if args.policy == "fcfs" else "rotate")
    # A request must fit the model's context and, alone, the KV pool.
    max_model_len = min(model.max_position_embeddings,
                        engine_config.num_kv_blocks * engine_config.block_size)
    layout = RingLayout(num_slots=args.ring_slots, max_prompt_tokens=max_model_len,
                        max_output_tokens=max_model_len, max_logprobs=args.max_logprobs)
    executor = resolve_executor(args.executor, args.policy, serves_ring=True, on_gpu=will_use_gpu())
    settings = ServeSettings(
        model_name=args.served_model_name or default_model_name(folder),
        max_model_len=max_model_len, max_output_tokens=layout.max_output_tokens,
        vocab_size=model.vocab_size, max_queue=args.max_queue or layout.num_slots,
        api_key=args.api_key, max_logprobs=layout.max_logprobs,
        max_logit_bias=layout.max_logit_bias,
        # the persistent kernel applies penalties and logit_bias from the ring as it samples
        # (forward_ops.SamplingHistory) but publishes no logprobs
        no_logprobs=executor if executor in PERSISTENT_EXECUTORS else None)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    engine = EngineProcess(folder, engine_config, layout)
    try:
        watch = engine.start()
        supervisor = EngineSupervisor(engine, watch, max_restarts=args.max_engine_restarts)
        app = create_app(RingClient(engine.ring), tokenizer, settings, watch, supervisor)
        server = DrainingServer(uvicorn.Config(
            app, host=args.host, port=args.port, log_level=args.log_level,
            access_log=args.log_level in ("info", "debug", "trace"),
            timeout_graceful_shutdown=args.drain_timeout))
        server.banner = banner(args, settings, folder, layout, engine)
        supervisor.on_give_up = lambda: setattr(server, "should_exit", True)
        server.run()
        if not server.started:
            raise ValueError(f"could not listen on {args.host}:{args.port} (see above)")
    finally:
        engine.stop()
    return GAVE_UP_EXIT_STATUS if supervisor.gave_up else 0


def default_model_name(folder: Path) -> str:
    return "blink-edu-7m" if folder.resolve() == BUNDLED_DIR.resolve() else folder.name


def banner(args, settings: ServeSettings, folder: Path, layout: RingLayout,
           engine: EngineProcess) -> str:
    megabytes = layout.nbytes / 2**20
    return (f"blink_edu.serve: listening on http://{args.host}:{args.port} "
            f"(OpenAI API under /v1; /health, /metrics)\n"
            f"  model {settings.model_name!r} from {folder} (context {settings.max_model_len})\n"
            f"  ring {engine.ring.name}: {layout.num_slots} slots, {megabytes:.1f} MiB; "
            f"engine process {engine.process.pid} (executor {args.executor}, policy "
            f"{args.policy}: it prints its backend when loaded)")
