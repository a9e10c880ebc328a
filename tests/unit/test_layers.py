"""Imports run one way: each package imports only packages in layers below it (docs/ARCHITECTURE.md).

Every import statement counts, also those inside functions (a lazy import still couples the
code). The unit of a layer is a top-level package; no module is a special case.
"""

from __future__ import annotations

import ast
from pathlib import Path

from infra.versioning import PROJECT_PACKAGES

REPO = Path(__file__).resolve().parents[2]

# Bottom to top. A package may import its own modules and packages of lower layers only.
LAYERS: dict[str, int] = {
    "dapo_core": 0,  # the algorithm: pure functions (torch, numpy, math-verify)
    "schemas": 1,  # stage-boundary models and atomic shard I/O
    "settings": 1,  # one frozen dataclass per stage, validated on construction
    "storage": 2,  # run store (filesystem / object store), digests, checkpoints, run layout
    "readers": 3,  # raw problem sources: files, Hugging Face folders, synthetic problems
    "infra": 3,  # task environments, images, cache versions, DeepSpeed config, sizing
    "tracking": 3,  # experiment trackers: TensorBoard, W&B offline, MLflow file store
    "engines": 4,  # the work: curation, vLLM rollout, scoring, DeepSpeed training, evaluation
    "tasks": 5,  # the Flyte tasks: read inputs, call an engine, write outputs
    "reports": 5,  # pages and charts: plain records in, pages out
    "workflows": 6,  # the pipeline: the driver task, the step loop, run configs and binding
    "cli": 7,  # every face of the `dapo` command, deploy included
}


def unit_of(module: str) -> str:
    return module.split(".")[0]


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) of every absolute import in ``path``, function-level ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def layer_violations(root: Path, packages: tuple[str, ...]) -> list[str]:
    """Every import in ``root``'s ``packages`` that goes sideways or up, or touches a package with no layer."""
    problems = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            module = ".".join(path.relative_to(root).with_suffix("").parts)
            here = unit_of(module)
            if here not in LAYERS:
                problems.append(f"{path.relative_to(root)}: package {here!r} has no layer in LAYERS")
                continue
            for line, target in imports_of(path):
                if target.split(".")[0] not in packages:
                    continue  # stdlib or third-party
                there = unit_of(target)
                if there == here:
                    continue
                if there not in LAYERS or LAYERS[there] >= LAYERS[here]:
                    problems.append(f"{path.relative_to(root)}:{line}: {here} (layer {LAYERS.get(here)}) imports "
                                    f"{target} (layer {LAYERS.get(there)})")
    return problems


def test_every_project_package_has_a_layer() -> None:
    assert set(PROJECT_PACKAGES) <= set(LAYERS), set(PROJECT_PACKAGES) - set(LAYERS)


def test_imports_run_one_way() -> None:
    assert layer_violations(REPO, PROJECT_PACKAGES) == []


def test_the_check_catches_an_upward_and_a_sideways_import(tmp_path: Path) -> None:
    for package in ("dapo_core", "engines", "tasks", "workflows", "schemas", "settings"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "dapo_core" / "losses.py").write_text("def f():\n    from workflows.config import RunConfig\n")
    (tmp_path / "schemas" / "models.py").write_text("import settings.train\n")
    (tmp_path / "tasks" / "train.py").write_text("from engines.train.launch import train_step\nimport torch\n")
    found = layer_violations(tmp_path, ("dapo_core", "engines", "tasks", "workflows", "schemas", "settings"))
    assert found == [
        "dapo_core/losses.py:2: dapo_core (layer 0) imports workflows.config (layer 6)",
        "schemas/models.py:1: schemas (layer 1) imports settings.train (layer 1)",
    ]


def module_imports(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Module -> the project modules it imports (``from pkg import mod`` names the module ``pkg.mod``)."""
    paths = {".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p
             for package in packages for p in sorted((root / package).rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name in paths}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module in paths:
                named = {f"{node.module}.{a.name}" for a in node.names} & paths.keys()
                targets |= named if named else {node.module}
        graph[module] = targets - {module}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The modules that import each other in a circle, function-level imports included (Tarjan's
    strongly connected components with more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def test_no_modules_import_each_other_in_a_circle() -> None:
    # A circle (even through a lazy import inside a function) means neither module can be read,
    # tested or moved without the other: the one that is lower belongs in a module of its own.
    assert import_circles(module_imports(REPO, PROJECT_PACKAGES)) == []


def test_the_circle_check_finds_a_circle_through_a_lazy_import(tmp_path: Path) -> None:
    (tmp_path / "storage").mkdir()
    (tmp_path / "storage" / "__init__.py").write_text("")
    (tmp_path / "storage" / "a.py").write_text("from storage import b\n")
    (tmp_path / "storage" / "b.py").write_text("def f():\n    from storage.c import g\n")
    (tmp_path / "storage" / "c.py").write_text("import storage.a\n")
    (tmp_path / "storage" / "d.py").write_text("from storage import a\n")
    assert import_circles(module_imports(tmp_path, ("storage",))) == [["storage.a", "storage.b", "storage.c"]]
