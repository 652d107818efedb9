"""The shape of the runtime: its modules import one another in layers (no cycle, counting the
imports made inside functions), none rebinds another's globals, none finds our own parts
through ``sys.modules`` or ``importlib``, and one object owns what the agent puts in a
process."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "autoannot"
#: The command-line tools and their trace readers: not loaded into an instrumented process.
TOOLS = ("autoannot.traces", "autoannot.cli", "autoannot.__main__", "autoannot.agent.doctor",
         "autoannot.agent.commands")
#: What reads the job's own files while it runs (the watch, its metrics, the progress
#: published, the exported trace): loaded into a job only where asked, above the trace tools.
LIVE = "autoannot.live"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Our modules ``path`` imports, at its top or inside its functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in modules else node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return {name for name in found if name in modules and name != "autoannot"}


def _runtime() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) for name, path in modules.items()
            if not name.startswith(TOOLS)}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph.get(node, ()):
            if other not in graph:
                continue
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_among_the_runtime_modules() -> None:
    graph = _runtime()
    assert len(graph) > 20
    assert _cycles(graph) == []


#: The trace tools' folders, each importing only those before it (and the files' mechanics
#: beneath them all: ``traces/*.py``): readers make the table, the analysis reads both, the
#: renderers read the analysis, the commands (what the command line runs) use them all.
TRACE_LAYERS = ("table", "read", "analysis", "render", "commands")


def _layer(module: str) -> int:
    """A trace tool module's layer: -1 for the mechanics at ``traces/``' top."""
    parts = module.split(".")
    return TRACE_LAYERS.index(parts[2]) if len(parts) > 3 and parts[2] in TRACE_LAYERS else -1


def test_the_trace_tools_import_one_way_through_their_folders() -> None:
    """Issue 37: readers -> table -> analysis -> renderers, one way, visible in the folders
    (imports inside functions counted: a cycle hidden in a function is still a cycle)."""
    modules = _modules()
    graph = {name: _imports(path, modules) for name, path in modules.items()
             if name.startswith("autoannot.traces.")}
    assert len(graph) > 15
    assert _cycles(graph) == []
    assert {_layer(name) for name in graph} == {-1, 0, 1, 2, 3, 4}  # (every folder has modules)
    upward = sorted(f"{name} -> {other}" for name, imports in graph.items() for other in imports
                    if other.startswith("autoannot.traces.") and _layer(other) > _layer(name))
    assert upward == []


#: The runtime's folders, ground up, each importing only those before it: what every part
#: leans on; what a launch is (its words, which the trace tools share); the trace tools; where
#: launches go; how they are seen; the agent's owner. The modules left flat in ``autoannot/``
#: (the public API, the command line, the start-up hook) stand above them all.
RUNTIME_LAYERS = ("base", "native", "describe", "traces", "keep", "live", "observe", "agent")


def _runtime_layer(module: str) -> int:
    parts = module.split(".")
    if len(parts) > 2 or (len(parts) == 2 and parts[1] in RUNTIME_LAYERS):
        folder = parts[1]
        return RUNTIME_LAYERS.index(folder) if folder in RUNTIME_LAYERS else len(RUNTIME_LAYERS)
    return len(RUNTIME_LAYERS)  # a flat module: the public face


def test_the_runtime_imports_one_way_through_its_folders() -> None:
    """Issue 47: the runtime in folders by concern, imports one way (those inside functions
    counted), at most ten modules left flat, each folder saying what it is for."""
    modules = _modules()
    graph = {name: _imports(path, modules) for name, path in modules.items()}
    assert _cycles(graph) == []
    upward = sorted(f"{name} -> {other}" for name, imports in graph.items() for other in imports
                    if _runtime_layer(other) > _runtime_layer(name))
    assert upward == []
    flat = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(flat) <= 10, flat
    for folder in RUNTIME_LAYERS:
        doc = ast.get_docstring(ast.parse((PACKAGE / folder / "__init__.py").read_text()))
        assert doc, folder


def test_no_runtime_module_imports_the_trace_analysis() -> None:
    """The runtime takes from the trace tools only what both sides share (their face, the
    ledger format, names, atomic writes), never the analysis; only the live wing (the watch)
    reads rings with it."""
    offenders = sorted(f"{name} -> {other}" for name, imports in _runtime().items()
                       if not name.startswith(LIVE)
                       for other in imports if other.startswith("autoannot.traces.analysis"))
    assert offenders == []


#: The trace tools' words the runtime shares (what a launch, a graph and a ledger are called).
WORDS = ("autoannot.traces.names", "autoannot.traces.read.ledger")


def test_where_launches_are_kept_imports_only_the_trace_tools_words() -> None:
    """Issue 64: ``keep/`` (where launches go) imports nothing of the trace tools but their
    words; what reads rings, traces and the store while a job runs is the live wing's."""
    offenders = sorted(f"{name} -> {other}" for name, imports in _runtime().items()
                       if name.startswith("autoannot.keep")
                       for other in imports if other.startswith("autoannot.traces")
                       and other not in WORDS)
    assert offenders == []


def _private_reaches(tree: ast.AST) -> list[str]:
    """Names with a leading underscore taken from one of our modules (``module._name``,
    ``from autoannot.x import _name``)."""
    ours = {alias.asname or alias.name.rsplit(".", 1)[-1]
            for node in ast.walk(tree) if isinstance(node, ast.ImportFrom | ast.Import)
            for alias in node.names
            if (getattr(node, "module", None) or alias.name).startswith("autoannot")
            and not alias.name[:1].isupper()}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("autoannot"):
            found += [f"from {node.module} import {alias.name}" for alias in node.names
                      if alias.name.startswith("_") and not alias.name.startswith("__")]
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in ours and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            found.append(ast.unparse(node))
    return found


def test_no_module_reaches_into_another_modules_private_names() -> None:
    modules = _modules()
    offences = {name: _private_reaches(ast.parse(path.read_text()))
                for name, path in modules.items()}
    assert {name: found for name, found in offences.items() if found} == {}


def test_the_private_reach_check_finds_one() -> None:
    tree = ast.parse("from autoannot.observe import native_observer\n"
                     "from autoannot.keep.ledgers import _LOCK\n"
                     "ops = native_observer._ops()\n")
    assert _private_reaches(tree) == ["from autoannot.keep.ledgers import _LOCK",
                                      "native_observer._ops"]


def test_the_layer_check_finds_an_upward_import() -> None:
    assert _layer("autoannot.traces.render.skew") > _layer("autoannot.traces.analysis.matching")
    assert _layer("autoannot.traces.files") < _layer("autoannot.traces.table.rows")
    assert _layer("autoannot.traces.read") == -1  # (a folder's face: its own doc, no imports)


def test_the_cycle_check_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_the_owner_is_imported_by_nothing_below_it() -> None:
    """Only the public API and the start-up path import the owner: every other part is handed
    the ``Instrumentation``."""
    importers = {name for name, imports in _runtime().items()
                 if "autoannot.agent.instrumentation" in imports}
    assert importers == {"autoannot._startup", "autoannot.recorder", "autoannot.helper",
                         "autoannot.pytest_plugin", "autoannot.testing"}


def test_no_module_finds_our_parts_by_name_or_rebinds_another_modules_globals() -> None:
    modules = _modules()
    offences = []
    for name, path in modules.items():
        if name.startswith(TOOLS):
            continue
        tree = ast.parse(path.read_text())
        aliases = {alias.asname or alias.name.rsplit(".", 1)[-1]
                   for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)
                   for alias in node.names
                   if (getattr(node, "module", None) or alias.name).startswith("autoannot")}
        for node in ast.walk(tree):
            text = ast.unparse(node) if isinstance(node, ast.Call | ast.Subscript) else ""
            if "sys.modules" in text and "autoannot" in text:
                offences.append(f"{name}: {text}")
            if "import_module" in text and "autoannot" in text:
                offences.append(f"{name}: {text}")
            if isinstance(node, ast.Assign | ast.AugAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                            and target.value.id in aliases):
                        offences.append(f"{name}: {ast.unparse(target)} = ...")
    assert offences == []


#: The modules a launch passes through, from its observers to the route that writes it.
LAUNCH_PATH = ("keep/route.py", "observe/wrappers.py", "observe/annotation.py",
               "observe/group_hooks.py", "observe/native_observer.py", "observe/native_ring.py",
               "keep/ring.py", "keep/captures.py")
LONGEST_FUNCTION = 60
CLI_LINES = 400


def _own_lengths(tree: ast.AST) -> dict[str, int]:
    """Each function's length in lines, less the functions nested in it (each counted on its
    own), by its dotted name."""
    lengths: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    nested = sum(n.end_lineno - n.lineno + 1 for n in ast.walk(child)
                                 if n is not child
                                 and isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                                 and _outermost_in(n, child))
                    lengths[name] = child.end_lineno - child.lineno + 1 - nested
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return lengths


def _outermost_in(node: ast.AST, function: ast.AST) -> bool:
    """Whether ``node`` is a function nested directly in ``function`` (no function between)."""
    for parent in ast.walk(function):
        if parent is function:
            continue
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)) and node in list(
                ast.walk(parent)) and node is not parent:
            return False
    return True


def test_every_function_on_the_launch_path_is_short() -> None:
    """No function a launch passes through is over 60 lines (its nested functions counted
    on their own): the route's rule is read in one screen, not copied inline."""
    long = {f"{module}:{name}": n for module in LAUNCH_PATH
            for name, n in _own_lengths(ast.parse((PACKAGE / module).read_text())).items()
            if n > LONGEST_FUNCTION}
    assert long == {}
    launch = _own_lengths(ast.parse((PACKAGE / "keep/route.py").read_text()))
    assert "launcher.launch" in launch and "Route.run_whole" in launch


def test_the_length_check_counts_nested_functions_apart() -> None:
    source = "def outer():\n    x = 1\n    def inner():\n        return 2\n    return inner\n"
    assert _own_lengths(ast.parse(source)) == {"outer": 3, "outer.inner": 2}


def test_the_command_line_is_a_thin_shell() -> None:
    """``cli.py`` parses and dispatches: at most 400 lines, its commands' work elsewhere."""
    assert len((PACKAGE / "cli.py").read_text().splitlines()) <= CLI_LINES
