"""The package's layers, read from its import graph (every ``import`` in every module, those
inside functions too): each part imports only its own layer and the ones below it.

    config, backend, latency                         (no blink_edu imports but each other)
      <- kernels                                     (arrays in, arrays out)
      <- model, kv, ring, sched, sim                 (sim: a policy against a cost model)
      <- executors                                   (run a step: NumPy, kernels, the persistent kernel)
      <- engine                                      (the host engine: scheduler, step loop, process)
      <- serve, labs, bench, viz, llm, generate      (what a user runs)

and, within the top layer: the server's frontend never imports the engine (only its launcher
names the engine process's main), nothing imports the benchmarks, and the simulator imports
neither the engine nor the benchmarks (docs/design.md §8).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "blink_edu"
LAYERS = [{"config", "backend", "latency"}, {"kernels"}, {"model", "kv", "ring", "sched", "sim"},
          {"executors"}, {"engine"}, {"serve", "labs", "bench", "viz", "llm", "generate"}]
RANK = {part: rank for rank, parts in enumerate(LAYERS) for part in parts}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """The blink_edu modules ``path`` imports (absolute names)."""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("blink_edu")}
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            name = ".".join(base + ([node.module] if node.module else []))
            if name.startswith("blink_edu"):
                found |= {name} | {f"{name}.{a.name}" for a in node.names}
    return found


def part_of(module: str) -> str | None:
    """The layer part of ``blink_edu.<part>...`` (None for the package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in RANK else None


def edges() -> list[tuple[str, str]]:
    """(importer, imported) for every import between modules of the package."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = module_name(path)
        out += [(here, target) for target in sorted(imported(path)) if part_of(target)]
    return out


EDGES = edges()


def test_the_graph_is_read():
    assert ("blink_edu.engine.llm_engine", "blink_edu.engine.scheduler") in EDGES
    assert any(a.startswith("blink_edu.serve.launcher") and b.startswith("blink_edu.engine")
               for a, b in EDGES)  # an import inside a function counts too
    assert all(part_of(a) or a == "blink_edu" for a, _ in EDGES)


def test_no_module_imports_a_higher_layer():
    upward = [(a, b) for a, b in EDGES
              if part_of(a) and RANK[part_of(b)] > RANK[part_of(a)]]
    assert upward == []


@pytest.mark.parametrize("importer, forbidden", [
    ("sim", {"engine", "executors", "bench", "serve", "labs"}),
    ("serve", {"bench", "labs", "viz"}),
    ("engine", {"serve", "bench", "labs", "sim", "viz"}),
    ("executors", {"engine", "serve", "bench", "labs", "sim", "viz"}),
    ("labs", {"bench"}),
])
def test_a_part_never_imports_these(importer, forbidden):
    wrong = [(a, b) for a, b in EDGES if part_of(a) == importer and part_of(b) in forbidden]
    assert wrong == []


def test_only_the_launcher_of_the_server_knows_the_engine():
    wrong = [(a, b) for a, b in EDGES if part_of(a) == "serve" and part_of(b) == "engine"
             and not a.startswith("blink_edu.serve.launcher")]
    assert wrong == []
