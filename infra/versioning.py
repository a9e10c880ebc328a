"""Cache versions derived from the code a stage really runs: its import closure, read from source.

Flyte's automatic cache version hashes only the task function's own source, so editing a helper
it calls would silently reuse stale outputs; a hand-written list of modules per stage goes stale
the same way. Instead each stage's version hashes every project file it can execute: starting
from the task's own module, the transitive closure of its imports within the project packages
(``PROJECT_PACKAGES``), found statically with ``ast`` and following

- ``import a.b`` (and the ``__init__`` of every package on the way: Python runs them first),
- ``from a import b`` where ``b`` may be a submodule, and relative ``from . import b``,
- imports inside functions (the tasks import heavy stacks lazily) - but not those under
  ``if TYPE_CHECKING:``, which never run,
- code started by name rather than imported: ``["-m", "pkg.mod"]`` and ``["-c", "import ..."]``
  in an argument list (worker processes), and ``importlib.import_module("pkg.mod")`` literals.

The version is a hash of ``GLOBAL_SALT``, the stage name, and the path (relative to the project
root) and bytes of every file in the closure, so it does not depend on where the checkout lives
and any edit to that code invalidates exactly the stages that can run it. The task's inputs
(paths, config dataclasses, seeds) are part of Flyte's cache key on top of this version.

Not covered: third-party and standard-library code (pinned versions of dependencies are out of
scope here), and modules named only at run time by a config value (e.g. the curate stage's
``answer_rewrites`` hooks: their names are in the cache key, their code is not).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import tomllib
from collections.abc import Iterator
from pathlib import Path

# Bump to invalidate every stage's cache at once (e.g. after a change of run-store layout).
GLOBAL_SALT = "run-store-v1"

# The folder holding pyproject.toml and the project's packages.
PROJECT_ROOT = Path(__file__).resolve().parents[1]


def _project_packages(root: Path) -> tuple[str, ...]:
    """The top-level packages pyproject.toml installs (``[tool.setuptools.packages.find] include``)."""
    with (root / "pyproject.toml").open("rb") as handle:
        include = tomllib.load(handle)["tool"]["setuptools"]["packages"]["find"]["include"]
    return tuple(sorted({pattern.rstrip("*").rstrip(".") for pattern in include}))


# Top-level packages whose source is hashed; anything else is third-party or stdlib.
PROJECT_PACKAGES = _project_packages(PROJECT_ROOT)


def _module_file(root: Path, module: str) -> Path | None:
    """The source file of project module ``module`` under ``root`` (``None``: not a project module)."""
    parts = module.split(".")
    if parts[0] not in PROJECT_PACKAGES or not all(part.isidentifier() for part in parts):
        return None
    base = root.joinpath(*parts)
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST, expressions: bool) -> Iterator[ast.AST]:
    """Every node under ``tree`` except the bodies of ``if TYPE_CHECKING:`` blocks; statements
    only unless ``expressions`` (imports are statements; expressions are most of a file's nodes)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
        elif expressions:
            stack.extend(ast.iter_child_nodes(node))
        else:
            stack.extend(child for child in ast.iter_child_nodes(node) if not isinstance(child, ast.expr))


# Only a file holding one of these spells can start project code by name (see _named_imports).
_BY_NAME_MARKERS = (b"'-m'", b'"-m"', b"'-c'", b'"-c"', b"import_module", b"__import__")


def _string(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


@functools.lru_cache(maxsize=None)
def _named_imports(source: bytes, package: str) -> tuple[str, ...]:
    """Dotted names a module with this source may import (some are attributes, not modules).

    ``package`` anchors relative imports (the module's own name for an ``__init__``). Cached on
    the source itself, so an edited file is parsed again and an unchanged one never is.
    """
    names: list[str] = []
    by_name = any(marker in source for marker in _BY_NAME_MARKERS)
    for node in _runtime_nodes(ast.parse(source), expressions=by_name):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            names.append(base)
            names.extend(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
        elif isinstance(node, (ast.List, ast.Tuple, ast.Call)):
            # Processes started by module name (`python -m pkg.mod`, `python -c "import ..."`) and
            # `importlib.import_module("pkg.mod")`: code the stage runs without importing it here.
            items = node.args if isinstance(node, ast.Call) else node.elts
            values = [_string(item) for item in items]
            for flag, value in zip(values, values[1:]):
                if flag == "-m" and value:
                    names.append(value)
                elif flag == "-c" and value:
                    try:
                        names.extend(_named_imports(value.encode(), ""))
                    except SyntaxError:
                        pass
            func = node.func if isinstance(node, ast.Call) else None
            if func is not None and getattr(func, "attr", getattr(func, "id", None)) in ("import_module", "__import__"):
                if values and values[0]:
                    names.append(values[0])
    return tuple(names)


def import_closure(root: Path, module: str) -> list[Path]:
    """Every project source file under ``root`` that importing or running ``module`` can execute.

    Sorted; ``module`` itself included. A pure function of the files under ``root``.
    """
    root = Path(root).resolve()
    if _module_file(root, module) is None:
        raise ValueError(f"module {module!r} is not a source file under {root} (packages: {PROJECT_PACKAGES})")
    seen: dict[str, Path] = {}
    pending = [module]
    while pending:
        name = pending.pop()
        parts = name.split(".")
        # Importing a.b.c first runs a/__init__.py and a/b/__init__.py.
        for depth in range(1, len(parts) + 1):
            prefix = ".".join(parts[:depth])
            if prefix in seen:
                continue
            path = _module_file(root, prefix)
            if path is None:
                break  # not a project module (third-party, stdlib) or an attribute of one
            seen[prefix] = path
            package = prefix if path.name == "__init__.py" else prefix.rpartition(".")[0]
            pending.extend(_named_imports(path.read_bytes(), package))
    return sorted(set(seen.values()))


def code_version(stage: str, root: Path, module: str) -> str:
    """A short, stable version string for ``stage`` from the import closure of ``module`` under ``root``."""
    root = Path(root).resolve()
    digest = hashlib.sha256(f"{GLOBAL_SALT}|{stage}".encode())
    for path in import_closure(root, module):
        data = path.read_bytes()
        digest.update(f"\0{path.relative_to(root).as_posix()}\0{len(data)}\0".encode())
        digest.update(data)
    return f"{stage}-{digest.hexdigest()[:16]}"
