"""The core's shape, held by a test: layers, no import circles, short modules, a short RL step, docs that match.

The imports are read with ``ast`` from every module under ``rlzoo/``: module-level, inside functions and under
``TYPE_CHECKING`` alike (a type-only import is still a dependency). ``LAYERS`` is the one declared order, lowest
first; a module belongs to the longest unit of the list that contains it, and may import only from its own unit
or a lower one. The few units that are single modules of a higher package are the low-level parts of it that
lower layers need (why, beside each).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "rlzoo"

#: lowest first; a module may import from its own unit and from units listed before it
LAYERS: tuple[tuple[str, ...], ...] = (
    ("rlzoo.errors", "rlzoo.util"),
    ("rlzoo.hookspecs",),
    ("rlzoo.config",),  # the schema, loading and presets; resolution (below) needs the registry
    ("rlzoo.runtime.distributed",),  # which process am I: asked by checkpoints, learners and the run alike
    ("rlzoo.runtime.checkpoint.files",),  # crash-safe files and optimizer / RNG state, which engines save
    ("rlzoo.moe",),
    ("rlzoo.models",),
    ("rlzoo.interfaces", "rlzoo.tools"),  # the component contract, and the tool-call runner environments use
    ("rlzoo.services",),  # calling services robustly, which service-backed verifiers build on
    ("rlzoo.component_errors",),  # how errors name a component (the registry, preflight, episodes and run say it)
    ("rlzoo.registry", "rlzoo.local_plugins"),  # local plugins are loaded into a registry as entry points are
    ("rlzoo.config.resolution",),  # component specs validated against the registry
    ("rlzoo.engines",),
    ("rlzoo.episodes",),
    ("rlzoo.rl",),
    ("rlzoo.preflight",),
    ("rlzoo.reporting",),
    ("rlzoo.runtime",),
    ("rlzoo.mismatch",),  # rlzoo mismatch: a run's set-up (rlzoo.runtime), measured instead of trained
    ("rlzoo.sweep",),
    ("rlzoo.verifier_check",),  # rlzoo check-verifier: a run's verifier (rlzoo.runtime) scored on labelled pairs
    ("rlzoo.cli", "rlzoo"),
)

MAX_MODULE_LINES = 400
MAX_RL_STEP_LINES = 40
MAX_STEP_PARAMETERS = 4
#: the modules of the RL step whose functions take the step record and the components, not loose tensors (the
#: objective's call, the loss's own signature, is the objective's business)
STEP_MODULES = (
    "loop",
    "step_record",
    "rollouts",
    "advantages",
    "schedule",
    "overlap",
    "async_rollouts",
    "learner",
    "routing_learner",
    "critic",
    "teacher",
    "scoring",
)


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(CORE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports_of(module: str, path: Path, known: dict[str, Path]) -> list[tuple[int, str]]:
    """``(line, imported rlzoo module)`` for every import in the file, resolved to the module it loads."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != module and target.startswith("rlzoo"):
                out.append((node.lineno, target))
    return out


def unit_of(module: str) -> tuple[int, str]:
    """The layer index and unit of ``module``: the longest listed unit that is the module or contains it."""
    best = (-1, "")
    for index, units in enumerate(LAYERS):
        for unit in units:
            if (module == unit or module.startswith(unit + ".")) and len(unit) > len(best[1]):
                best = (index, unit)
    return best


def graph() -> dict[str, list[tuple[int, str]]]:
    known = modules()
    return {module: imports_of(module, path, known) for module, path in known.items()}


def test_every_module_has_a_layer():
    assert [m for m in modules() if unit_of(m)[0] < 0] == []


def test_no_import_reaches_up_a_layer():
    upward = []
    for module, edges in graph().items():
        layer, unit = unit_of(module)
        for line, target in edges:
            target_layer, target_unit = unit_of(target)
            if target_layer > layer:
                upward.append(f"{module.replace('.', '/')}.py:{line} imports {target} ({target_unit} is above {unit})")
    assert upward == [], "\n".join(upward)


def test_no_import_circle():
    edges = {module: {target for _, target in targets} for module, targets in graph().items()}
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(" <-> ".join(sorted(component)))

    for node in edges:
        if node not in index:
            visit(node)
    assert circles == [], "\n".join(circles)


def test_modules_stay_short():
    long = {
        str(p.relative_to(ROOT)): n
        for p in CORE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}, f"modules over {MAX_MODULE_LINES} lines: {long}"


def code_lines(function: ast.FunctionDef, source: str) -> int:
    """Lines of a function's body that hold code: no docstring, no blank or comment-only lines."""
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    lines = source.splitlines()[body[0].lineno - 1 : function.end_lineno]
    return sum(1 for line in lines if line.strip() and not line.strip().startswith("#"))


def test_rl_step_reads_on_one_screen():
    path = CORE / "rl" / "loop.py"
    source = path.read_text()
    [step] = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == "rl_step"]
    assert code_lines(step, source) <= MAX_RL_STEP_LINES


def test_no_function_of_the_step_takes_more_than_four_parameters():
    """Constructors and ``evaluate`` (not part of the step) aside; ``self`` is not counted."""
    wide = []
    for module in STEP_MODULES:
        path = CORE / "rl" / f"{module}.py"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name not in ("__init__", "evaluate"):
                args = node.args
                names = [
                    a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs] if a.arg not in ("self", "cls")
                ]
                if len(names) > MAX_STEP_PARAMETERS:
                    wide.append(f"rlzoo/rl/{module}.py:{node.lineno} {node.name}({', '.join(names)})")
    assert wide == [], "\n".join(wide)


def test_the_architecture_page_names_every_module():
    """docs/architecture.md lists every core module by path (``rlzoo/rl/loop.py``), and names none that is gone."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"rlzoo/[\w/]+\.py", text))
    present = {str(p.relative_to(ROOT)) for p in CORE.rglob("*.py")}
    missing = sorted(p for p in present - named if not p.endswith("__init__.py"))
    gone = sorted(named - present)
    assert (missing, gone) == ([], []), f"not in docs/architecture.md: {missing}; named there but absent: {gone}"


@pytest.mark.parametrize("unit", [u for units in LAYERS for u in units])
def test_every_layer_unit_exists(unit):
    assert unit in modules(), f"LAYERS names {unit}, which is no module or package"
