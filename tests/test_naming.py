"""One name per idea. "Plan" is the idea the code is built on: a generator
that yields effects (``gds_counter/gateway/plan.py``), written once and run
blocking or awaited. Two other ideas once shared the word and were renamed,
so a reader who meets "plan" knows which one it is:

* the embedded engine's answer to a query is its *scan* (``_scans.Scan``:
  the index scan Datastore would run, its candidate keys, sort orders and
  rows), not a "query plan" or a "planner";
* how many shards a write rate needs is *sizing* (``size_shards``,
  ``ShardSizing``, ``gds-counter size``), not a "shard plan".

These checks fail when a name or a word for either comes back."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Iterator

from gds_counter.cli import COMMANDS

ROOT = Path(__file__).resolve().parent.parent
#: The code whose names are checked: the product, its tests and benchmarks.
CODE = ("gds_counter", "tests", "benchmarks", "examples")
#: The prose and code whose words are checked.
TEXT = ("gds_counter", "tests", "benchmarks", "examples", "docs", "README.md")

#: The one module named for the idea (all its names are the idea), and the
#: test of its ``plan.Step``.
GENERATOR_MODULES = {"gds_counter/gateway/plan.py", "tests/gateway/test_plan_steps.py"}

#: Names elsewhere with "plan" in them that are generator plans though no
#: annotation says so, each with its reason.
GENERATOR_NAMES = {
    "FaultPlans": "testing/faults.py: the fault-injecting gateway hooks, each a plan",
    "planned": "a plan handed on to a driver (a lambda's parameter)",
    "Plan": "gateway/_effects.py: the generator type itself",
    "RulePlans": "gateway/_calls.py: what a gateway answers with its own rule plans",
    "PlannedStrategy": "counter/strategy.py: a strategy whose attempt is a plan (plan_add)",
    "is_planned": "counter/strategy.py: whether a strategy's attempt is a plan",
    "_planned": "counter/_engine.py: the counter's strategy, as a plan (or None)",
    "HookPlans": "gateway/_driven_hooks.py: a gateway's eight hooks, each a plan",
    "BlockingPlannedHooks": "gateway/_driven_hooks.py: those hook plans run by the blocking driver",
    "AsyncPlannedHooks": "gateway/_driven_hooks.py: those hook plans run by the async driver",
}

#: Words of the two other ideas. SQLite's own statement, ``EXPLAIN QUERY
#: PLAN``, is SQLite's name for SQLite's idea and is left out.
RETIRED_WORDS = re.compile(
    r"planner|planning|query plan|sort plan|shard plan|ShardPlan|plan_shards|gds-counter plan\b|\bplan --rate",
    re.IGNORECASE,
)
SQLITE_STATEMENT = re.compile(r"EXPLAIN QUERY PLAN")


def _files(roots: tuple[str, ...], suffixes: tuple[str, ...]) -> Iterator[Path]:
    for root in roots:
        path = ROOT / root
        if path.is_file():
            yield path
            continue
        for found in sorted(path.rglob("*")):
            if found.suffix in suffixes and found.is_file() and ".venv" not in found.parts:
                yield found


def _annotated_as_generator(node: ast.expr | None) -> bool:
    """Whether an annotation names the generator type, ``Plan[...]`` (or
    ``plan.Plan[...]``, or a union holding one)."""
    return node is not None and re.search(r"\bPlan\b", ast.unparse(node)) is not None


def _defined_names(tree: ast.AST) -> Iterator[tuple[str, int, bool]]:
    """Each name a module defines (functions, classes, parameters, assigned
    names and attributes), its line, and whether an annotation says it is a
    plan (a function's return, a parameter's or a variable's type)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, _annotated_as_generator(node.returns)
        elif isinstance(node, ast.ClassDef):
            yield node.name, node.lineno, False
        elif isinstance(node, ast.arg):
            yield node.arg, node.lineno, _annotated_as_generator(node.annotation)
        elif isinstance(node, ast.AnnAssign):
            target = node.target
            name = target.id if isinstance(target, ast.Name) else target.attr if isinstance(target, ast.Attribute) else ""
            yield name, node.lineno, _annotated_as_generator(node.annotation)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            yield node.id, node.lineno, False
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            yield node.attr, node.lineno, False


def misnamed(source: str) -> list[tuple[str, int]]:
    """The names with "plan" in them that are not the generator idea: not
    annotated as a ``Plan`` and not in ``GENERATOR_NAMES``. A test's name
    is a sentence, not a name of the code: it is left to the words check
    (``RETIRED_WORDS``)."""
    names = [(name, line, annotated) for name, line, annotated in _defined_names(ast.parse(source)) if "plan" in name.lower()]
    cleared = {(name, line) for name, line, annotated in names if annotated}  # x: Plan[int] = ... is also a bare store of x
    return sorted(
        {
            (name, line)
            for name, line, _ in names
            if (name, line) not in cleared and name not in GENERATOR_NAMES and not name.startswith("test_")
        }
    )


def test_no_module_but_the_generator_plans_is_named_for_a_plan():
    """A module named for a plan is ``gateway/plan.py`` or its test: the
    engine's scans live in ``_scans``, shard sizing in ``_sizing``."""
    named = [str(p.relative_to(ROOT)) for p in _files(CODE, (".py",)) if "plan" in p.name.lower()]
    assert sorted(named) == sorted(GENERATOR_MODULES)


def test_every_name_with_plan_in_it_is_a_generator_plan():
    found = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in _files(CODE, (".py",))
        if str(path.relative_to(ROOT)) not in GENERATOR_MODULES
        for name, line in misnamed(path.read_text(encoding="utf-8"))
    ]
    assert not found, "names that are not generator plans (rename them, or add a reason to GENERATOR_NAMES):\n" + "\n".join(found)


def test_the_name_check_tells_a_plan_from_another_idea():
    """The check can fail: it passes what an annotation or ``GENERATOR_NAMES``
    says is a plan, and names the rest."""
    source = '''
from gds_counter.gateway import plan

def counts_plan(keys) -> plan.Plan[list[int]]:
    planned = yield from plan.lookup(keys)
    return planned

def run_it(work: plan.Plan[int] | None, retry_plan: "Plan[int]") -> None: ...

_PLANS: dict[str, Callable[..., Plan[Any]]] = {}

class ShardPlan: ...

def plan_shards(rate): ...

def scan(query_plan, plan: "Plan[int]"): ...

def test_plan_prints_the_shards(): ...
'''
    assert misnamed(source) == [("ShardPlan", 12), ("plan_shards", 14), ("query_plan", 16)]


def test_no_text_speaks_of_query_plans_planners_or_shard_plans():
    found = []
    for path in _files(TEXT, (".py", ".md", ".txt", ".html", ".js", ".cfg", ".toml", ".yaml")):
        if path == Path(__file__).resolve():
            continue  # this file names the retired words to forbid them
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if RETIRED_WORDS.search(SQLITE_STATEMENT.sub("", line)):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_command_sizes_shards_under_one_name():
    """``gds-counter size`` is the command; ``plan`` is no alias of it."""
    assert "size" in COMMANDS
    assert not [name for name in COMMANDS if "plan" in name]
