"""The package's import graph, read from the source with `ast`: no loops, the layers in pipeline order (case,
plan, checkpoint, launch, run, verdict) with the engine below `cases` and the front ends, pytest only in the
plugin, no module that starts a pytest session, and `rlsmoke plan` without torch."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import rlsmoke

SRC = Path(rlsmoke.__file__).parent


def _module(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in sorted(SRC.rglob("*.py"))}


def _imports(path: Path) -> set[str]:
    """Every module imported anywhere in the file. `from pkg import name`
    counts pkg.name when that is a module, else pkg; a module named by a string in a file that calls
    `importlib.import_module` counts too (the CLI's subcommands), so no arrow hides."""
    tree = ast.parse(path.read_text())
    here = _module(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    anywhere = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        anywhere.update(names)
    if "import_module" in {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}:
        # the bare root name is the program's name in a string (`prog="rlsmoke"`), not a module to import
        anywhere |= {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in MODULES
                     and n.value != "rlsmoke"}  # fmt: skip
    return anywhere


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    """Every module's arrows to the package's other modules (read when a test needs it, not at collection)."""
    return {m: {n for n in _imports(p) if n in MODULES and n != m} for m, p in MODULES.items()}


def test_the_import_graph_has_no_loops(graph):
    done, stack = set(), []

    def visit(m):
        if m in stack:
            raise AssertionError("import loop: " + " -> ".join(stack[stack.index(m) :] + [m]))
        if m in done:
            return
        stack.append(m)
        for n in sorted(graph[m]):
            visit(n)
        stack.pop()
        done.add(m)

    for m in sorted(graph):
        visit(m)


# The pipeline, in order: a case is planned, its checkpoint prepared, its launch rendered, its run executed,
# its verdict judged. The front ends (the commands, the suite, the plugin) come after and read them all.
PIPELINE = (
    ("case", ("rlsmoke.facts", "rlsmoke.models", "rlsmoke.platforms", "rlsmoke.recipe", "rlsmoke.cases")),
    ("plan", ("rlsmoke.targets", "rlsmoke.overrides", "rlsmoke.topology", "rlsmoke.topology_rules", "rlsmoke.memory",
              "rlsmoke.residency", "rlsmoke.resolve")),
    ("checkpoint", ("rlsmoke.checkpoints", "rlsmoke.bridge")),
    ("launch", ("rlsmoke.launch",)),
    ("run", ("rlsmoke.engine", "rlsmoke.processes")),
    ("verdict", ("rlsmoke.metrics", "rlsmoke.thresholds", "rlsmoke.repeats", "rlsmoke.gating")),
)  # fmt: skip
FRONT = ("rlsmoke.cli", "rlsmoke.run_flags", "rlsmoke.run_command", "rlsmoke.miles_rollout", "rlsmoke.selection", "rlsmoke.suite",
         "rlsmoke.pytest_plugin", "rlsmoke.plugin_session")  # fmt: skip
# What a plan is made of: no torch, nothing of a later layer (`cases` renders its launch lazily, in Case.plan).
PURE_PLAN = (
    "rlsmoke.facts",
    "rlsmoke.models",
    "rlsmoke.platforms",
    "rlsmoke.recipe",
    "rlsmoke.targets",
    "rlsmoke.overrides",
    "rlsmoke.topology",
    "rlsmoke.topology_rules",
    "rlsmoke.memory",
    "rlsmoke.residency",
)


def _layer(module: str) -> str | None:
    found = [
        (len(p), name)
        for name, prefixes in PIPELINE
        for p in prefixes
        if module == p or module.startswith(p + ".")
    ]
    return max(found)[1] if found else None


def test_every_layer_and_front_end_names_modules_that_exist():
    prefixes = [p for _, ps in PIPELINE for p in ps] + list(FRONT)
    assert [p for p in prefixes if not any(m == p or m.startswith(p + ".") for m in MODULES)] == []


def engine_arrows_up(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """The engine runs a decided RunConfig: its arrows to `cases` (the case layer's flags and rendering),
    `resolve`, the launch or a front end."""
    above = ("rlsmoke.cases", "rlsmoke.resolve", "rlsmoke.launch", "rlsmoke.gating", *FRONT)
    found = {
        m: sorted(n for n in to if n.startswith(above))
        for m, to in graph.items()
        if m.startswith("rlsmoke.engine")
    }
    return {m: n for m, n in found.items() if n}


def plan_arrows_later(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """A plan module's arrows to a later layer (checkpoint, launch, run, verdict)."""
    later = ("checkpoint", "launch", "run", "verdict")
    found = {
        m: sorted(n for n in to if _layer(n) in later) for m, to in graph.items() if m.startswith(PURE_PLAN)
    }
    return {m: n for m, n in found.items() if n}


PROCESS_MODULES = ("rlsmoke.processes", "subprocess", "multiprocessing", "signal", "ray")


def launch_arrows_to_processes(imports: dict[str, set[str]]) -> dict[str, list[str]]:
    """The launch renders: its imports of what starts or signals a process (`processes`, the stdlib's, Ray)."""
    found = {
        m: sorted(n for n in to if any(n == p or n.startswith(p + ".") for p in PROCESS_MODULES))
        for m, to in imports.items()
        if m.startswith("rlsmoke.launch")
    }
    return {m: n for m, n in found.items() if n}


def test_the_launch_renders_and_starts_no_process():
    imports = {m: _imports(p) for m, p in MODULES.items()}
    assert launch_arrows_to_processes(imports) == {}
    twin = {"rlsmoke.launch.flow": {"rlsmoke.processes.runner", "rlsmoke.launch.miles", "subprocess", "json"}}
    assert launch_arrows_to_processes(twin) == {
        "rlsmoke.launch.flow": ["rlsmoke.processes.runner", "subprocess"]
    }


def test_the_engine_imports_no_case_nor_what_decides_or_reads_a_run(graph):
    assert engine_arrows_up(graph) == {}


def test_the_plan_imports_no_later_layer(graph):
    assert plan_arrows_later(graph) == {}


def test_the_layer_checks_see_a_wrong_arrow():
    """The twin: an engine module that imported `cases`, or a plan module that imported the engine, is found."""
    twin = {
        "rlsmoke.engine.run": {"rlsmoke.cases", "rlsmoke.memory"},
        "rlsmoke.memory": {"rlsmoke.engine.config"},
    }
    assert engine_arrows_up(twin) == {"rlsmoke.engine.run": ["rlsmoke.cases"]}
    assert plan_arrows_later(twin) == {"rlsmoke.memory": ["rlsmoke.engine.config"]}


def test_the_library_never_imports_pytest():
    plugin = ("rlsmoke.pytest_plugin", "rlsmoke.plugin_session")  # the plugin's hooks and its plain helpers
    users = sorted(m for m, p in MODULES.items() if m not in plugin
                   and {"pytest", "_pytest"} & {n.split(".")[0] for n in _imports(p)})  # fmt: skip
    assert users == []


def _pytest_sessions(source: str) -> list[str]:
    """Where code starts a pytest session: `pytest.main(...)`, or an argv naming pytest (`-m pytest`, a
    `pytest` executable) in a list or tuple."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "main"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "pytest"):  # fmt: skip
            found.append(f"line {node.lineno}: pytest.main")
        if isinstance(node, (ast.List, ast.Tuple)):
            words = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if any(w == "pytest" or w.endswith("/pytest") for w in words):
                found.append(f"line {node.lineno}: argv {words}")
    return found


def test_no_module_of_the_library_starts_a_pytest_session():
    """A session inside a session changes what pytest promises (order, options, -x, the debugger);
    speed comes from xdist. The twin: the shapes such code takes are found."""
    starts = {m: where for m, p in MODULES.items() if (where := _pytest_sessions(p.read_text()))}
    assert starts == {}
    twin = 'import pytest, sys\nargv = [sys.executable, "-m", "pytest", "-q"]\npytest.main(["-x"])\n'
    assert len(_pytest_sessions(twin)) == 2


def test_plan_imports_no_torch():
    code = ("import sys; from rlsmoke.cli import main; rc = main(['plan', 'glm5-744b-a40b-4layer', '--platform', "
            "'nvidia', '--num-gpus', '8']); print(sorted(m for m in ('torch', 'transformers', 'ray') if m in sys.modules))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_run_config_imports_neither_the_engine_nor_the_launch():
    """`rlsmoke run` checks its flags before the engine's clock starts: the launch (Miles' argv, the plan's
    diff) and the engine's heavy packages are not imported for it."""
    code = ("import sys; from rlsmoke.cli import build_parser; from rlsmoke.run_flags import config_from_args; "
            "config_from_args(build_parser('run').parse_args(['run', 'glm5-744b-a40b-4layer', '--platform', 'cpu'])); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'ray', 'megatron', "
            "'fla', 'triton') or m.startswith(('rlsmoke.launch', 'rlsmoke.conformance', 'rlsmoke.engine.run'))))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def missing_modules(names) -> list[str]:
    """The rlsmoke modules among `names` that do not exist (a fork server skips those without a word)."""
    return [n for n in names if n.startswith("rlsmoke.") and n not in MODULES]


def test_the_fork_servers_preload_rlsmoke_modules_that_exist():
    from rlsmoke.engine import procs
    from rlsmoke.processes import here

    assert missing_modules((procs.SERVER_SETUP, *here.PRELOAD)) == []
    assert missing_modules(("rlsmoke.engine.cli", "rlsmoke.engine.run")) == ["rlsmoke.engine.cli"]  # the twin
