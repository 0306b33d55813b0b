"""The data layer reads one way (issue 34): its modules import each other at module level only, in an order
without a circle, and each imports alone in a fresh interpreter."""

from __future__ import annotations

import ast
import subprocess
import sys
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import hf_vrl.data

DATA = Path(hf_vrl.data.__file__).parent
MODULES = sorted(p.stem for p in DATA.glob("*.py") if p.stem != "__init__")


def _data_imports(node: ast.AST) -> set[str]:
    """The hf_vrl.data modules an import statement names (relative or absolute)."""
    names: set[str] = set()
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level == 1 or base.startswith("hf_vrl.data"):
            base = base.removeprefix("hf_vrl.data").lstrip(".")
            if base:
                names.add(base.split(".")[0])
            else:
                names |= {alias.name for alias in node.names}
    elif isinstance(node, ast.Import):
        names |= {a.name.split(".")[2] for a in node.names if a.name.startswith("hf_vrl.data.")}
    return names & set(MODULES)


def _tree(module: str) -> ast.Module:
    return ast.parse((DATA / f"{module}.py").read_text())


def test_no_function_imports_a_data_module():
    """An import of hf_vrl.data inside a function body is how a circle is dodged: there is none."""
    found = []
    for module in MODULES:
        for fn in ast.walk(_tree(module)):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if _data_imports(node):
                        found.append(f"{module}.{fn.name}: {sorted(_data_imports(node))}")
    assert found == []


def test_module_imports_form_no_circle():
    graph = {m: set().union(*(_data_imports(n) for n in _tree(m).body)) for m in MODULES}
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as error:  # pragma: no cover - the failure message names the circle
        raise AssertionError(f"import circle in hf_vrl.data: {error.args[1]}") from None
    # the layers: decoding below the readers, the readers below the catalogue of layouts and the registry
    assert order.index("images") < order.index("readers") < order.index("layouts") < order.index("registry")
    assert order.index("benchmarks") < order.index("readers")


def test_each_module_imports_alone():
    code = "import importlib, sys; [importlib.import_module(f'hf_vrl.data.{m}') for m in sys.argv[1:2]]"
    for module in ("layouts", "readers", "benchmarks", "prompts", "registry", "imagenet", "transfer"):
        run = subprocess.run([sys.executable, "-c", code, module], capture_output=True, text=True)
        assert run.returncode == 0, f"{module}: {run.stderr.strip().splitlines()[-1:]}"
