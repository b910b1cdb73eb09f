"""The documentation is checked against the repository (issue 24, goal 6).

* Every relative link in README.md and docs/*.md points to a file that
  exists, and a ``#anchor`` into a markdown file to one of its headings
  (GitHub's slugs).
* README.md is a front door: at most 300 lines.
* Every module of this package that docs/architecture.md names exists.
* The README gives two test commands, the quick loop and the full run, and
  ``.ci/run`` runs the full one verbatim.

Each checker is also run on made-up input that it must reject, so a
checker that silently checks nothing fails here too.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gds_counter"
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
ARCHITECTURE = ROOT / "docs" / "architecture.md"
README_MAX_LINES = 300

FENCE = re.compile(r"^(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


# --- reading markdown ------------------------------------------------------------------


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (links and headings there are
    examples, not links)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lower-cased,
    punctuation dropped (letters, digits, ``_`` and ``-`` kept), each space
    a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link renders as its text
    text = INLINE_CODE.sub(lambda m: m.group(2), text)
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("*", "")
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor GitHub gives the headings of a markdown text (a repeated
    heading gets ``-1``, ``-2``...)."""
    found: set[str] = set()
    counts: dict[str, int] = {}
    for line in prose_lines(text):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        n = counts.get(base, 0)
        counts[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(text: str) -> list[str]:
    """Every link target of a markdown text (inline, image and reference
    style), outside code."""
    targets = []
    for line in prose_lines(text):
        line = INLINE_CODE.sub("", line)
        targets += LINK.findall(line)
        reference = REFERENCE.match(line)
        if reference:
            targets.append(reference.group(1))
    return targets


def broken_links(path: Path) -> list[str]:
    """The relative links of ``path`` whose file, or whose heading, does not
    exist, each with the reason."""
    problems = []
    for target in links(path.read_text(encoding="utf-8")):
        if SCHEME.match(target) or target.startswith("//"):
            continue  # http(s), mailto: not checked here
        where, _, anchor = target.partition("#")
        where = unquote(where.split("?", 1)[0])
        file = (path.parent / where).resolve() if where else path
        if not file.exists():
            problems.append(f"{target}: no file {file}")
            continue
        if anchor and file.suffix == ".md":
            if unquote(anchor).lower() not in anchors(file.read_text(encoding="utf-8")):
                problems.append(f"{target}: no heading with anchor #{anchor} in {file.name}")
    return problems


# --- (a) links --------------------------------------------------------------------------


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_to_an_existing_file_and_heading(path):
    assert not broken_links(path), "\n".join(broken_links(path))


def test_the_link_checker_reads_links_and_headings():
    """The README and the docs hold links the checker sees, and headings
    whose slugs are GitHub's."""
    assert len(links(README.read_text(encoding="utf-8"))) >= 10
    assert slug("The kind prefix (`KIND_PFX`)") == "the-kind-prefix-kind_pfx"
    assert slug("4. The cut-over") == "4-the-cut-over"
    assert slug("Mechanisms: what each buys, and what it means when it fails") == (
        "mechanisms-what-each-buys-and-what-it-means-when-it-fails")
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}


def test_the_link_checker_rejects_missing_files_and_headings(tmp_path):
    (tmp_path / "other.md").write_text("# Present heading\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n"
        "[ok](other.md) [ok](other.md#present-heading) [ok](#page) [web](https://example.com/x.md)\n"
        "[gone](missing.md) [no heading](other.md#absent) [no local heading](#nowhere)\n"
        "![gone image](img/none.png)\n"
        "`[in code](also-missing.md)`\n"
        "```\n[in a block](missing-too.md)\n```\n"
    )
    problems = broken_links(page)
    assert [p.split(":")[0] for p in problems] == ["missing.md", "other.md#absent", "#nowhere", "img/none.png"]


# --- (b) the README is a front door ---------------------------------------------------


def test_the_readme_is_at_most_300_lines():
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert 0 < lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail into docs/"


# --- (c) the modules docs/architecture.md names exist ------------------------------------

#: A path-like name: ``a/b/c.py`` or ``a/b/`` (a package), not part of a longer word or path.
PATH = re.compile(r"(?<![\w./-])((?:[A-Za-z_]\w*/)*(?:[A-Za-z_]\w*\.py|[A-Za-z_]\w*/))(?![\w/])")
#: A dotted name in this package: ``gds_counter.counter.cache`` (maybe with an attribute).
DOTTED = re.compile(r"(?<![\w.])gds_counter(?:\.[A-Za-z_]\w*)+")
#: Paths of the repository outside the package: not modules, not checked here.
OUTSIDE = ("tests/", "benchmarks/", "docs/", "examples/", ".ci/")
#: Names shaped like modules that are not: the embedded default's database file.
NOT_MODULES = ("gds_counter.sqlite3",)


def module_names(text: str) -> list[str]:
    """Every name in ``text`` that looks like a module or package of this
    package: ``gds_counter/...`` paths, dotted ``gds_counter.x.y`` names,
    and relative ``x/y.py`` or ``x/`` names (in code or prose)."""
    names = []
    for match in PATH.finditer(text):
        name = match.group(1)
        if not name.startswith(OUTSIDE) and name not in ("gds_counter/",):
            names.append(name)
    names += [name for name in DOTTED.findall(text) if name not in NOT_MODULES]
    return list(dict.fromkeys(names))


def resolves(name: str, package: Path = PACKAGE) -> bool:
    """Whether ``name`` is a module (file) or package (directory with
    ``__init__.py``) of ``package``. ``gds_counter/...`` and dotted names are
    resolved from the package root; a relative name is fine if some path
    under the package ends with it (``embedded/_storage.py`` is
    ``gds_counter/gateway/embedded/_storage.py``). A dotted name may end in
    an attribute of the module it names (``gds_counter.counter.MAX_SHARDS``)."""
    if DOTTED.fullmatch(name):
        parts = name.split(".")[1:]
        here = package
        for i, part in enumerate(parts):
            if (here / part / "__init__.py").is_file():
                here = here / part
            elif (here / f"{part}.py").is_file():
                return i == len(parts) - 1 or _defines(here / f"{part}.py", parts[i + 1])
            else:
                return _defines(here / "__init__.py", part)
        return True
    if name.startswith(package.name + "/"):
        candidates = [package / name[len(package.name) + 1:]]
    else:
        candidates = list(package.glob("**/" + name.rstrip("/")))
    for path in candidates:
        if name.endswith("/") and (path / "__init__.py").is_file():
            return True
        if name.endswith(".py") and path.is_file():
            return True
    return False


def _defines(module: Path, attribute: str) -> bool:
    """Whether a module's source defines or imports ``attribute`` (read,
    not imported: a doc check should not run the package)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return attribute in names


def _fake_package(root: Path) -> Path:
    """A package tree of known shape, so the resolver's own test does not
    depend on modules that are being moved."""
    package = root / "gds_counter"
    for path, text in {
        "__init__.py": "from gds_counter.counter import CounterShardDS\n",
        "cli.py": "def main():\n    pass\n",
        "counter/__init__.py": "from gds_counter.counter.engine import (\n    MAX_SHARDS,\n)\n",
        "counter/engine.py": "MAX_SHARDS = 10_000\nclass CounterShardDS:\n    pass\n",
        "gateway/__init__.py": "",
        "gateway/plan.py": "",
        "gateway/embedded/__init__.py": "",
        "gateway/embedded/_storage.py": "",
        "notes/readme.py": "",  # a directory without __init__.py is no package
    }.items():
        (package / path).parent.mkdir(parents=True, exist_ok=True)
        (package / path).write_text(text)
    return package


def test_the_module_resolver_accepts_real_names_and_rejects_made_up_ones(tmp_path):
    package = _fake_package(tmp_path)
    for real in ("gateway/plan.py", "embedded/_storage.py", "gateway/embedded/_storage.py", "counter/engine.py",
                 "engine.py", "embedded/", "counter/", "gds_counter/cli.py", "gds_counter/gateway/",
                 "gds_counter.counter.engine", "gds_counter.gateway", "gds_counter.counter.MAX_SHARDS",
                 "gds_counter.counter.engine.CounterShardDS", "gds_counter.CounterShardDS"):
        assert resolves(real, package), real
    for fake in ("gateway/no_such_module.py", "no_such_package/", "counter/plan.py", "embedded/engine.py",
                 "gateway/_storage.py", "notes/", "gds_counter/no_such.py", "gds_counter/gateway/no_such/",
                 "gds_counter/plan.py", "gds_counter.gateway.no_such_module", "gds_counter.counter.NO_SUCH_NAME",
                 "gds_counter.no_such", "gds_counter.cli.no_such"):
        assert not resolves(fake, package), fake
    # and on the real package
    assert resolves("gateway/", PACKAGE) and not resolves("gateway/no_such_module.py", PACKAGE)
    assert module_names("`gateway/plan.py` and **aio/** then gds_counter.counter.cache, "
                        "`tests/test_docs.py`, `docs/benchmarks/x.json`, https://example.com/a/b.py, "
                        "gds_counter.sqlite3") == ["gateway/plan.py", "aio/", "gds_counter.counter.cache"]


def test_architecture_names_many_modules():
    """The collector finds the modules the document is about (a collector
    that found nothing would pass the next test vacuously)."""
    assert len(module_names(ARCHITECTURE.read_text(encoding="utf-8"))) >= 20


def test_every_module_docs_architecture_names_exists():
    names = module_names(ARCHITECTURE.read_text(encoding="utf-8"))
    missing = [name for name in names if not resolves(name)]
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


# --- (d) nothing in the package goes unnamed -------------------------------------------


def _package_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name not in ("__init__.py", "__main__.py"))


def test_architecture_names_every_module():
    """Each module holds one idea, and docs/architecture.md says which: a
    module added without a word there is a part a reader cannot find (the
    document had left out 14, all of server/ among them)."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    unnamed = [str(p.relative_to(PACKAGE)) for p in _package_modules()
               if not re.search(rf"`{re.escape(p.stem)}(\.py)?`|(?<![\w.]){re.escape(p.name)}\b", text)]
    assert not unnamed, f"docs/architecture.md does not name these modules: {unnamed}"


def test_architecture_names_only_constants_that_exist():
    """A constant the document names (`GROUP_WAIT_S` was one) is in the code."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    source = "\n".join(p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py"))
    named = set(re.findall(r"`([A-Z][A-Z0-9]*_[A-Z0-9_]+)`", text))
    assert named, "the collector found no constant"
    assert not [n for n in sorted(named) if not re.search(rf"\b{n}\b", source)]


def test_the_readme_lists_every_document_and_every_package():
    """The README is the front door: its documentation table links every
    document in docs/, and its layout names every subpackage."""
    text = README.read_text(encoding="utf-8")
    table = text.split("## Documentation", 1)[1]
    missing_docs = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if f"](docs/{p.name})" not in table]
    assert not missing_docs, f"README's documentation table leaves out {missing_docs}"
    layout = text.split("## Layout", 1)[1].split("## ", 1)[0]
    packages = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
    assert packages and not [p for p in packages if f"gds_counter/{p}/" not in layout], packages


# --- (d) the README's test commands are the ones CI runs --------------------------------


def readme_test_commands(text: str) -> list[str]:
    """The commands of the README's Testing section's shell block, comments cut."""
    section = re.search(r"^## Testing\n(.*?)(?=^## )", text, re.S | re.M)
    assert section, "README.md has no Testing section"
    block = re.search(r"^```sh\n(.*?)^```", section.group(1), re.S | re.M)
    assert block, "README.md's Testing section has no sh block"
    return [line.split("#", 1)[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_ci_runs_the_readmes_full_test_command_verbatim():
    """Two test commands: the quick loop is the default ``pytest`` (no
    option, after installing the test extras it needs), the full run
    installs, lints, type-checks and runs ``pytest --full``
    (tests/sizes.py). CI must run the full one, exactly as the README gives
    it, or a green CI would not mean the full run passed."""
    quick, full = readme_test_commands(README.read_text(encoding="utf-8"))
    assert quick.endswith("pytest") and quick.startswith("pip install -e") and "--full" not in quick
    assert full.endswith("&& pytest --full") and full.startswith("pip install -e")
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    assert full in ci, f".ci/run does not run the README's full test command {full!r}"
