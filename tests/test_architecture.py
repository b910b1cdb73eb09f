"""The package's shape, checked: imports only go down the layers, never in a
circle (``TYPE_CHECKING`` imports included), no module holds more than about
one idea's worth of code, and the product never imports test tooling."""

from __future__ import annotations

import ast
import configparser
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gds_counter"
MAX_LINES = 600

#: The layers, lowest first, as (name, module patterns). A module may import
#: modules of its own layer or of a lower one, never of a higher one. "pkg.*"
#: is every module under pkg at any depth; a name without "*" is that module
#: only, so a new top-level module must be given a layer here.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("checks, errors and the process", ("gds_counter._checks", "gds_counter.errors", "gds_counter._process", "gds_counter._process.*")),
    ("gateway", ("gds_counter.gateway", "gds_counter.gateway.*")),
    ("gds", ("gds_counter.gds", "gds_counter.gds.*")),
    ("counter", ("gds_counter.counter", "gds_counter.counter.*")),
    ("aio", ("gds_counter.aio", "gds_counter.aio.*")),
    ("server", ("gds_counter.server", "gds_counter.server.*")),
    (
        "top",
        (
            "gds_counter",
            "gds_counter.__main__",
            "gds_counter.cli",
            "gds_counter.cli.*",
            "gds_counter._demo",
            "gds_counter._load",
            "gds_counter.emulators",
        ),
    ),
)
#: Test tooling, outside the product: it may import anything, and nothing in
#: the product imports it (test_the_product_never_imports_test_tooling).
OUTSIDE_THE_LAYERS = ("gds_counter.testing", "gds_counter.testing.*")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Every module's imports of other gds_counter modules, wherever they
    stand in the file (function bodies and TYPE_CHECKING blocks too)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                # "from pkg import mod" imports the module pkg.mod when there is one
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and target.startswith("gds_counter"):
                    graph[name].add(target)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            # A package's __init__ importing its own submodules is how it
            # exports them, not a dependency between ideas.
            if nxt.startswith(node + "."):
                continue
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycles_among_gds_counter_modules():
    assert _cycle(_imports()) is None, " -> ".join(_cycle(_imports()) or [])


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def _matches(module: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatchcase(module, pattern) for pattern in patterns)


def _layers_of(module: str, layers: tuple[tuple[str, tuple[str, ...]], ...]) -> list[int]:
    return [n for n, (_, patterns) in enumerate(layers) if _matches(module, patterns)]


def _upward_imports(
    graph: dict[str, set[str]],
    layers: tuple[tuple[str, tuple[str, ...]], ...],
    outside: tuple[str, ...] = (),
) -> list[str]:
    """Every import of a module in a higher layer than the importer's, as
    "importer (layer n: name) -> target (layer m: name)"."""
    found = []
    for module in sorted(graph):
        if _matches(module, outside):
            continue
        [mine] = _layers_of(module, layers)
        for target in sorted(graph[module]):
            # a package's __init__ importing its own submodules exports them
            if target.startswith(module + ".") or _matches(target, outside):
                continue
            [theirs] = _layers_of(target, layers)
            if theirs > mine:
                found.append(
                    f"{module} (layer {mine}: {layers[mine][0]}) -> {target} (layer {theirs}: {layers[theirs][0]})"
                )
    return found


def test_every_module_has_exactly_one_layer():
    for module in sorted(_imports()):
        if not _matches(module, OUTSIDE_THE_LAYERS):
            assert len(_layers_of(module, LAYERS)) == 1, f"{module} needs exactly one layer in LAYERS"


def test_imports_only_go_down_the_layers():
    upward = _upward_imports(_imports(), LAYERS, OUTSIDE_THE_LAYERS)
    assert not upward, "imports of a higher layer:\n" + "\n".join(upward)


def test_the_layer_check_finds_an_upward_import():
    layers = (("low", ("low", "low.*")), ("high", ("high", "high.*")))
    graph = {
        "low": {"low.a"},  # a package importing its own submodule
        "low.a": {"low.b"},  # same layer
        "low.b": {"high.c"},  # up: the one violation
        "high": {"high.c", "low"},  # down
        "high.c": {"low.a", "tools"},  # down, and outside the layers
        "tools": {"high", "low"},  # outside: may import anything
    }
    assert _upward_imports(graph, layers, outside=("tools",)) == ["low.b (layer 0: low) -> high.c (layer 1: high)"]
    graph["low.b"] = set()
    assert _upward_imports(graph, layers, outside=("tools",)) == []


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_is_over_600_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.name} has {lines} lines"


def test_the_product_never_imports_test_tooling():
    graph = _imports()
    product = [name for name in graph if not name.startswith("gds_counter.testing")]
    for name in product:
        assert not {t for t in graph[name] if t.startswith("gds_counter.testing")}, name


#: Imports of another package's underscore module that are allowed, each
#: with its reason (docs/architecture.md, "Front doors"). At most three.
BACK_DOORS: dict[tuple[str, str], str] = {}

#: Product modules whose names do not start with ``_`` (``__init__`` and
#: ``__main__`` aside, test tooling outside): the public face, kept small.
MAX_PUBLIC_MODULES = 30


def _back_doors(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every import of an underscore module that belongs to a package which
    is neither the importer's own nor one of its ancestors: such a module is
    machinery, reached through its package's ``__init__``."""
    found = []
    for module, targets in sorted(graph.items()):
        path = PACKAGE.parent.joinpath(*module.split("."))
        own = module if (path / "__init__.py").exists() else module.rpartition(".")[0]
        for target in sorted(targets):
            parts = target.split(".")
            for depth, part in enumerate(parts):
                if part.startswith("_") and not part.startswith("__"):
                    owner = ".".join(parts[:depth])
                    if not (own == owner or own.startswith(owner + ".")):
                        found.append((module, ".".join(parts[: depth + 1])))
                    break
    return found


def test_no_module_imports_another_packages_machinery():
    doors = [door for door in _back_doors(_imports()) if door not in BACK_DOORS]
    assert not doors, "back doors:\n" + "\n".join(f"{a} -> {b}" for a, b in doors)
    assert len(BACK_DOORS) <= 3


def test_the_back_door_check_finds_one():
    graph = {
        "gds_counter.counter.sharded": {"gds_counter.counter._engine", "gds_counter._checks"},
        "gds_counter.gateway.embedded._storage": {"gds_counter.gateway._paths"},  # an ancestor's
        "gds_counter.aio.counter": {"gds_counter.counter._engine"},  # another package's: the one
    }
    assert _back_doors(graph) == [("gds_counter.aio.counter", "gds_counter.counter._engine")]


def test_the_public_face_stays_small():
    public = sorted(
        name
        for name in _imports()
        if not _matches(name, OUTSIDE_THE_LAYERS)
        and not any(part.startswith("_") for part in name.split(".")[1:])
        and (PACKAGE.parent / (name.replace(".", "/") + ".py")).exists()
    )
    assert len(public) <= MAX_PUBLIC_MODULES, f"{len(public)} public modules: {public}"


#: The one module that asks which process this is (``forks.here`` and
#: ``forks.owned_here``): every fork check goes through it.
FORK_CHECKS = "_process/forks.py"


def _process_id_asked(source: str) -> list[int]:
    """The lines of ``source`` that ask for the process id (``os.getpid``,
    called or not, or ``getpid`` imported from ``os``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "getpid":
            found.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and any(a.name == "getpid" for a in node.names):
            found.append(node.lineno)
    return found


def test_every_fork_check_goes_through_forks_owned_here():
    """A child forked while another thread held a lock or a connection must
    not use it: every object that could holds ``forks.here()`` and asks
    ``forks.owned_here``. One check, so a reader finds every fork-sensitive
    object by one name, and no module asks ``os.getpid()`` its own way."""
    asking = {
        str(path.relative_to(PACKAGE)): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if not _matches(_module_name(path), OUTSIDE_THE_LAYERS)
        and (lines := _process_id_asked(path.read_text()))
    }
    assert set(asking) == {FORK_CHECKS}, f"ask forks.owned_here instead: {asking}"


def test_the_fork_check_rule_finds_a_process_id():
    assert _process_id_asked("import os\nif pid != os.getpid():\n    pass\n") == [2]
    assert _process_id_asked("from os import getpid\n") == [1]
    assert _process_id_asked("from gds_counter._process import forks\nforks.owned_here(pid)\n") == []


# --- typed effects --------------------------------------------------------------------

#: The modules a value passes through between a counter's plan and a
#: backend's hook (docs/architecture.md, "Plans").
EFFECT_PATH = (
    "gateway/plan.py", "gateway/_effects.py", "gateway/_calls.py", "gateway/_hooks.py", "gateway/_rules.py",
    "gateway/base.py", "gateway/datastore/_requests.py", "counter/_engine.py", "counter/_totals.py",
    "counter/strategy.py", "counter/shard_choice.py", "aio/counter.py",
)
#: The modules mypy checks with no ``Any`` at all (setup.cfg): there a name
#: looked up at run time cannot even be typed.
STRICT_EFFECT_MODULES = ("gateway/plan.py", "gateway/_effects.py", "gateway/_calls.py", "gateway/_hooks.py")
#: What a name looked up on that path would name: a gateway call, a
#: backend hook or transport, or what the engine asks of a strategy or of a
#: shard chooser.
DISPATCHED_NAMES = frozenset({
    "lookup", "run_query", "run_aggregation", "begin_transaction", "commit", "rollback", "allocate_ids",
    "reserve_ids", "capabilities", "learn_capabilities", "_lookup", "_run_query", "_run_aggregation", "_begin",
    "_commit", "_rollback", "_allocate_ids", "_reserve_ids", "_send", "add", "plan_add", "take", "give_back",
    "wrote", "seen",
})
#: The string-dispatched effect and its tables, before effects were typed.
RETIRED_NAMES = frozenset({"Op", "OP_NAMES", "_PLANS", "plan_of", "inline", "told", "add_plan"})


def _name_dispatch(source: str, *, strict: bool) -> list[str]:
    """Where ``source`` looks a name up at run time: ``getattr``, ``hasattr``
    or ``setattr`` of a literal that names a call of the effect path, or
    (``strict``) of any name not written as a literal; and any definition
    of a retired name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in {"getattr", "hasattr", "setattr"}:
            name = node.args[1] if len(node.args) > 1 else None
            literal = name.value if isinstance(name, ast.Constant) and isinstance(name.value, str) else None
            if literal in DISPATCHED_NAMES or (strict and literal is None):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name in RETIRED_NAMES:
            found.append(f"line {node.lineno}: defines {node.name}")
        elif isinstance(node, ast.Assign):
            found += [f"line {node.lineno}: defines {t.id}" for t in node.targets if isinstance(t, ast.Name) and t.id in RETIRED_NAMES]
    return found


@pytest.mark.parametrize("module", EFFECT_PATH)
def test_effects_are_typed_calls_not_names_looked_up(module):
    """From ``add()`` to the backend hook every effect is a typed class that
    performs itself (``gateway._calls``, ``gateway._hooks``), and the engine
    calls its strategy and shard chooser by method: no effect names a
    method for a driver to look up (the retired ``Op("commit")``,
    ``_PLANS``, ``told(chooser, "wrote")``, ``getattr(strategy,
    "plan_add")``), where neither readers nor mypy could follow it."""
    path = PACKAGE / module
    assert path.exists(), f"{module} is gone: update EFFECT_PATH"
    assert _name_dispatch(path.read_text(), strict=module in STRICT_EFFECT_MODULES) == []


def test_the_name_dispatch_check_finds_each_kind():
    source = (
        "class Op: pass\n_PLANS = {}\n"
        "def perform(gateway, op):\n    return getattr(gateway, op.name)()\n"
        "def tell(chooser):\n    return getattr(chooser, 'wrote')(1)\n"
        "def fine(gateway):\n    return getattr(gateway, 'path', None)\n"
    )
    assert len(_name_dispatch(source, strict=False)) == 3  # Op, _PLANS, 'wrote'
    assert len(_name_dispatch(source, strict=True)) == 4  # and op.name


def test_mypy_checks_the_effect_path_with_no_any():
    """CI runs mypy before the tests; setup.cfg must keep the effect modules
    under ``disallow_any_expr`` (and the other Any bans), so that an
    effect whose answer is not typed, or a method looked up by name,
    fails there."""
    config = configparser.ConfigParser()
    config.read(PACKAGE.parent / "setup.cfg")
    wanted = {"gds_counter." + module.removesuffix(".py").replace("/", ".") for module in STRICT_EFFECT_MODULES}
    strict: set[str] = set()
    for section in config.sections():
        if section.startswith("mypy-"):
            options = config[section]
            if all(options.getboolean(flag, False) for flag in ("disallow_any_expr", "disallow_any_explicit", "disallow_any_generics")):
                strict |= {name.strip() for name in section.removeprefix("mypy-").split(",")}
    assert wanted <= strict, f"not checked strictly: {sorted(wanted - strict)}"
