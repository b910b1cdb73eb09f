"""What the product keeps in module globals, checked: per-gateway and
per-process state lives in a gateway's runtime (``counter.runtime``), not in
module-level tables. A module-level mutable container or context variable
that is not listed below fails this test until it is listed, with why it
must be a module global."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "gds_counter"

#: The product's module-level registries: at most two.
REGISTRIES = {
    ("gateway/__init__.py", "_SHARED"): "URL -> the shared gateway of code that names none, both faces",
    ("_process/forks.py", "_MEMBERS"): "the objects whose fork hooks the one os.register_at_fork calls",
}

#: Other module-level state, each with the reason it cannot go with a gateway.
OTHER_STATE = {
    ("_process/forks.py", "_LOCK"): "the fork registry's lock, held across a fork",
    ("_process/forks.py", "_FORKING"): "the members of the fork in progress (empty between forks)",
    ("_process/forks.py", "_RAISED"): "what a hook raised during the fork in progress (empty between forks)",
    ("_process/forks.py", "_NESTED"): "forks made by a signal's handler inside another fork's hooks (empty between forks)",
    ("_process/forks.py", "_BEGAN"): "when the fork in progress began: one bound for its hooks' waits (empty between forks)",
    ("_process/forks.py", "_ABANDONED"): (
        "SQLite connections and gRPC clients a forked child inherited: kept for ever, since closing one (even "
        "when its gateway is collected) would release the parent's SQLite locks or wait on a parent's gRPC lock"
    ),
    ("_process/deadlines.py", "_AT"): "the running call's deadline: per call (a context variable), not per gateway",
}

#: Module-level tables that are never changed after import (names, rules).
CONSTANT_TABLES = {
    ("cli/_context.py", "COMMANDS"), ("counter/strategy.py", "STRATEGIES"), ("gateway/__init__.py", "_PARAMS"),
    ("counter/_redis_url.py", "_OPTIONS"), ("counter/_redis_url.py", "RANGES"),
    ("gateway/datastore/_codec.py", "_OPS"), ("gateway/datastore/_codec.py", "_OPS_BACK"), ("gateway/embedded/_filter_check.py", "RANGE_OPS"),
    ("gateway/embedded/_metadata.py", "_REPRESENTATIONS"),
    ("gateway/embedded/_index_sql.py", "_SQL_OPS"), ("gds/_gql_lexer.py", "_STRING_ESCAPES"),
    ("gds/_gql_conditions.py", "_MIRRORED"), ("server/_status.py", "HTTP_STATUS"), ("gds/_gql_printer.py", "_PRINTED_OPS"), ("gds/schema.py", "_WRITERS"),
}

_MUTABLE_LITERALS = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
_MUTABLE_CALLS = (
    "dict", "list", "set", "collections.OrderedDict", "OrderedDict", "collections.defaultdict", "defaultdict",
    "collections.deque", "deque", "weakref.WeakKeyDictionary", "weakref.WeakValueDictionary", "weakref.WeakSet",
    "WeakKeyDictionary", "WeakValueDictionary", "WeakSet", "contextvars.ContextVar", "ContextVar",
    "threading.Lock", "threading.RLock", "_SharedGateways",
)


def module_state(root: Path) -> set[tuple[str, str]]:
    """(file relative to ``root``, name) of every module-level assignment of
    a mutable container, lock or context variable (``__all__`` aside)."""
    found = set()
    for path in sorted(root.rglob("*.py")):
        if "testing" in path.relative_to(root).parts:
            continue  # test tooling, outside the product
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            else:
                continue
            mutable = isinstance(value, _MUTABLE_LITERALS) or (
                isinstance(value, ast.Call) and ast.unparse(value.func) in _MUTABLE_CALLS
            )
            for target in targets:
                if mutable and isinstance(target, ast.Name) and target.id != "__all__":
                    found.add((str(path.relative_to(root)), target.id))
    return found


def test_the_product_keeps_at_most_two_registries_and_no_unlisted_module_state():
    unlisted = module_state(PACKAGE) - set(REGISTRIES) - set(OTHER_STATE) - CONSTANT_TABLES
    assert not unlisted, f"module-level state not listed here (should it live in a gateway's runtime?): {sorted(unlisted)}"
    assert len(REGISTRIES) <= 2


def test_every_listed_name_still_exists():
    assert set(REGISTRIES) | set(OTHER_STATE) | CONSTANT_TABLES <= module_state(PACKAGE)


def test_the_scan_finds_a_new_module_level_table(tmp_path):
    (tmp_path / "mod.py").write_text(
        "import weakref\n__all__ = ['x']\n_per_gateway = weakref.WeakKeyDictionary()\nCONST = 3\n_seen: dict = {}\n"
    )
    assert module_state(tmp_path) == {("mod.py", "_per_gateway"), ("mod.py", "_seen")}
