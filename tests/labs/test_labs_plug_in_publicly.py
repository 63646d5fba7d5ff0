"""The labs plug into the project through declared extension points — constructor arguments and
public, documented hooks — never through a project class's private members: no class under
``blink_edu/labs/`` overrides (or assigns) a private ``_name`` of a project base class, and no
code there reaches for ``obj._name`` of an object that is not its own ``self`` or ``cls``."""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
from pathlib import Path

import pytest

from blink_edu import labs
from blink_edu.kv.transfer import NumpyTransport

LABS_DIR = Path(labs.__file__).resolve().parent
PACKAGE_ROOT = LABS_DIR.parents[1]  # the folder that holds blink_edu/


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def is_project_class_outside_labs(obj) -> bool:
    module = getattr(obj, "__module__", "") or ""
    return (inspect.isclass(obj) and module.startswith("blink_edu.")
            and not module.startswith("blink_edu.labs"))


def private_members(cls) -> set[str]:
    """The private names a project class owns: its methods and class attributes, and the
    attributes its own code assigns on ``self``."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    assigned = {node.attr for node in ast.walk(tree)
                if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name) and node.value.id == "self"}
    return {name for name in set(vars(cls)) | assigned if is_private(name)}


def resolve(node: ast.expr, namespace: dict):
    """The object a base-class expression (``Name`` or dotted ``Attribute``) names, or None."""
    if isinstance(node, ast.Name):
        return namespace.get(node.id)
    if isinstance(node, ast.Attribute):
        return getattr(resolve(node.value, namespace), node.attr, None)
    return None


def inherited_private_members(classdef: ast.ClassDef, namespace: dict) -> set[str]:
    """The private members of every project class (outside the labs) this class derives from."""
    bases = [resolve(base, namespace) for base in classdef.bases]
    ancestors = {c for base in bases if inspect.isclass(base) for c in base.__mro__}
    return set().union(*(private_members(c) for c in ancestors if is_project_class_outside_labs(c)))


def names_defined_in(classdef: ast.ClassDef) -> list[tuple[str, int]]:
    """(name, line) of each method and class attribute the class body defines."""
    defined = []
    for item in classdef.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            defined.append((item.name, item.lineno))
        targets = item.targets if isinstance(item, ast.Assign) else \
            [item.target] if isinstance(item, ast.AnnAssign) else []
        defined += [(t.id, item.lineno) for t in targets if isinstance(t, ast.Name)]
    return defined


class PrivateReach(ast.NodeVisitor):
    """Collects where a module overrides or touches a private member it does not own."""

    def __init__(self, namespace: dict):
        self.namespace = namespace
        self.inherited: list[set[str]] = [set()]  # of the classes being visited, innermost last
        self.found: list[str] = []

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        inherited = inherited_private_members(node, self.namespace)
        self.found += [f"line {line}: {node.name} overrides {name}"
                       for name, line in names_defined_in(node) if name in inherited]
        self.inherited.append(inherited)
        self.generic_visit(node)
        self.inherited.pop()

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if is_private(node.attr):
            own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            if not own:
                self.found.append(f"line {node.lineno}: {ast.unparse(node)} (not its own)")
            elif node.attr in self.inherited[-1]:
                self.found.append(f"line {node.lineno}: {ast.unparse(node)} (a base class's)")
        self.generic_visit(node)


def private_reaches(source: str, namespace: dict) -> list[str]:
    visitor = PrivateReach(namespace)
    visitor.visit(ast.parse(source))
    return visitor.found


@pytest.mark.parametrize("path", sorted(LABS_DIR.rglob("*.py")), ids=lambda p: p.relative_to(LABS_DIR).as_posix())
def test_labs_use_only_public_members_of_project_classes(path):
    name = ".".join(path.relative_to(PACKAGE_ROOT).with_suffix("").parts).removesuffix(".__init__")
    module = importlib.import_module(name)
    assert private_reaches(path.read_text(), vars(module)) == []


@pytest.mark.parametrize("source", [
    "class T(NumpyTransport):\n    def _try_land(self, ticket):\n        return True",
    "class T(NumpyTransport):\n    def copy_in(self, *args):\n        return self._issue(*args)",
    "class T(NumpyTransport):\n    _start = None",
    "class T(NumpyTransport):\n    def tick(self):\n        super()._start(None, [])",
    "def land(transport, ticket):\n    return transport._try_land(ticket)",
], ids=["overrides a method", "calls a base's method", "replaces a base's method",
        "calls through super()", "calls another object's method"])
def test_the_check_catches(source):
    assert private_reaches(source, {"NumpyTransport": NumpyTransport})


def test_the_check_lets_a_class_keep_private_members_of_its_own():
    source = ("class T(NumpyTransport):\n    def __init__(self, plan):\n        self._plan = plan\n"
              "    def _planned(self):\n        return self._plan")
    assert private_reaches(source, {"NumpyTransport": NumpyTransport}) == []
