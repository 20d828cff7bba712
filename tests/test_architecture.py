"""docs/architecture.md holds: module sizes, function lengths, the layer table."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

import dask_scd

PACKAGE = Path(dask_scd.__file__).resolve().parent
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"
MODULE_LINES = 600
FUNCTION_LINES = 80
KEPT_WHOLE = "Kept whole:"  # how a long function's docstring says why


def _section(title: str) -> str:
    text = ARCHITECTURE.read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def test_long_modules_are_the_ones_the_architecture_names():
    """No library module over 600 lines but those docs/architecture.md lists, with why."""
    listed = set(re.findall(r"`(dask_scd/[\w/]+\.py)`", _section("Modules longer than")))
    long = {
        str(path.relative_to(PACKAGE.parent))
        for path in PACKAGE.rglob("*.py")
        if path.read_text().count("\n") > MODULE_LINES
    }
    assert long == listed, f"over {MODULE_LINES} lines: {sorted(long)}; listed: {sorted(listed)}"


def _code_lines(node) -> int:
    """Lines of a function without its docstring."""
    first = node.body[0]
    has_doc = isinstance(first, ast.Expr) and isinstance(
        getattr(first, "value", None), ast.Constant
    )
    start = first.end_lineno + 1 if has_doc and len(node.body) > 1 else first.lineno
    return node.end_lineno - start + 1


def test_long_functions_say_why():
    """A function of more than ~80 lines of code says why in its docstring ("Kept whole:")."""
    unexplained = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if _code_lines(node) > FUNCTION_LINES and KEPT_WHOLE not in (
                ast.get_docstring(node) or ""
            ):
                unexplained.append(f"{path.relative_to(PACKAGE.parent)}:{node.name}")
    assert not unexplained, unexplained


def test_the_layer_table_names_every_layer():
    """Each import-linter layer's modules appear in docs/architecture.md's layer table, and
    the table names nothing that does not exist."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    config = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    layers = config["tool"]["importlinter"]["contracts"][0]["layers"]
    table = [
        row.split("|")[2] for row in ARCHITECTURE.read_text().splitlines() if row.count("|") >= 4
    ]
    named = {name.strip("`/ ") for cell in table for name in re.findall(r"`([\w/]+)`", cell)}
    for layer in layers:
        for module in layer.split("|"):
            short = module.strip().removeprefix("dask_scd.")
            assert short in named, f"{short} is missing from the layer table"
    for name in named:
        assert (PACKAGE / name).is_dir() or (PACKAGE / f"{name}.py").exists(), name


def _public_callables():
    """dask_scd's public functions, classes and their public methods."""
    names = getattr(dask_scd, "__all__", [n for n in dir(dask_scd) if not n.startswith("_")])
    for name in names:
        item = getattr(dask_scd, name)
        if not callable(item):
            continue
        yield name, item
        if inspect.isclass(item):
            for attribute, value in vars(item).items():
                if attribute.startswith("_") or isinstance(value, property):
                    continue
                method = getattr(item, attribute)
                if callable(method) and getattr(method, "__module__", "").startswith("dask_scd"):
                    yield f"{name}.{attribute}", method


def test_public_functions_have_numpydoc_sections():
    """A public function or method that takes arguments documents them under
    "Parameters"; one that returns something says what under "Returns"; a public class
    documents its arguments or attributes."""
    missing = []
    for name, item in _public_callables():
        doc = inspect.getdoc(item) or ""
        if inspect.isclass(item):
            if not issubclass(item, Exception) and not re.search(
                r"^(Parameters|Attributes)\n-+$", doc, re.M
            ):
                missing.append(f"{name}: Parameters or Attributes")
            continue
        signature = inspect.signature(item)
        arguments = [p for p in signature.parameters if p not in ("self", "cls")]
        if arguments and not re.search(r"^Parameters\n-+$", doc, re.M):
            missing.append(f"{name}: Parameters")
        returns = signature.return_annotation
        if returns not in (None, "None", inspect.Signature.empty) and not re.search(
            r"^(Returns|Yields)\n-+$", doc, re.M
        ):
            missing.append(f"{name}: Returns")
    assert not missing, missing


def test_the_tests_index_names_every_test_file():
    """tests/README.md maps the package to its tests: every test file is in it."""
    tests = Path(__file__).resolve().parent
    index = (tests / "README.md").read_text()
    missing = [path.name for path in tests.glob("test_*.py") if f"`{path.name}`" not in index]
    assert not missing, missing
