"""Showing the package's own code and timings in a chapter: ``show_source`` and ``fmt_us``.

A chapter that explains a function shows it as it is in the file, not a copy that could drift
from it (docs/design.md §7).
"""

from __future__ import annotations

import ast
import inspect
import textwrap


def source_of(module, *names: str) -> str:
    """The functions ``names`` of ``module`` (nested ones too), decorators included, exactly as
    in the file, one after another."""
    source = inspect.getsource(module)
    lines = source.splitlines()
    parts = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names:
            first = min([d.lineno for d in node.decorator_list] + [node.lineno])
            parts.append(textwrap.dedent("\n".join(lines[first - 1:node.end_lineno])))
    missing = set(names) - {n.name for n in ast.walk(ast.parse(source))
                            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if missing:
        raise ValueError(f"{module.__name__} has no function {', '.join(sorted(missing))}")
    return "\n\n\n".join(parts)


def show_source(module, *names: str) -> None:
    """Display ``source_of(module, *names)`` as a highlighted Python block in the notebook."""
    from IPython.display import Markdown, display

    display(Markdown("```python\n" + source_of(module, *names) + "\n```"))


def fmt_us(us: float | None) -> str:
    """A duration given in µs, in the unit that reads best: "12.3 µs", "456 µs", "7.89 ms"."""
    if us is None:
        return "n/a"
    if us >= 1000:
        return f"{us / 1e3:.2f} ms"
    return f"{us:.1f} µs" if us < 100 else f"{us:.0f} µs"
