"""The like app's deployment files live with the example, not at the root
(the root is for the project): ``examples/like_app/Dockerfile``, its
``Dockerfile.dockerignore`` and ``app.yaml``. The image is built from the
repository root (``docker build -f examples/like_app/Dockerfile .``), so
everything the Dockerfile copies must be there, and not ignored. Docker is
read here, not run; ``test_like_app_deployed`` runs the Dockerfile's
command."""

from __future__ import annotations

import re
import shlex
from fnmatch import fnmatchcase
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "like_app"
DOCKERFILE = EXAMPLE / "Dockerfile"
DEPLOYMENT_FILES = ("Dockerfile", "Dockerfile.dockerignore", "app.yaml")


def test_the_deployment_files_live_with_the_example():
    assert [name for name in DEPLOYMENT_FILES if (EXAMPLE / name).is_file()] == list(DEPLOYMENT_FILES)
    at_root = [name for name in (*DEPLOYMENT_FILES, ".dockerignore", ".gcloudignore") if (ROOT / name).exists()]
    assert not at_root, f"deployment files of the example at the repository root: {at_root}"


def _ignored(path: str, patterns: list[str]) -> bool:
    """Whether a .dockerignore's patterns leave ``path`` (relative to the
    context) out: the last matching pattern decides, ``!`` re-includes.
    ``**`` is taken as any number of directories (close enough for these
    patterns, which hold no character classes)."""
    out = False
    parts = path.split("/")
    for pattern in patterns:
        negated, pattern = pattern.startswith("!"), pattern.lstrip("!")
        # a pattern also matches a directory above the path (then all under it is out)
        if any(fnmatchcase("/".join(parts[: n + 1]), pattern.replace("**/", "*")) for n in range(len(parts))):
            out = not negated
    return out


def test_the_dockerfile_copies_from_the_repository_root_what_is_there_and_not_ignored():
    text = DOCKERFILE.read_text(encoding="utf-8")
    patterns = [
        line.strip()
        for line in (EXAMPLE / "Dockerfile.dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    sources = [s for line in re.findall(r"^COPY (.+)$", text, re.MULTILINE) for s in shlex.split(line)[:-1]]
    assert "gds_counter" in sources and "examples/like_app" in sources
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: not in the build context (the repository root)"
        assert not _ignored(source, patterns), f"COPY {source}: left out by Dockerfile.dockerignore"
    assert _ignored("tests/test_like_app.py", patterns) and _ignored("examples/like_app/app.yaml", patterns)
    assert not _ignored("examples/like_app/app.py", patterns)
    app_dir = re.search(r"--app-dir (\S+)", text)
    assert app_dir is not None and (ROOT / app_dir.group(1) / "app.py").is_file()


def test_the_build_and_deploy_commands_are_written_down_where_they_run_from():
    """The image builds from the root with ``-f``; App Engine deploys the
    built image (``--image-url``): built from ``examples/like_app`` alone,
    it would lack the library."""
    build = "docker build -f examples/like_app/Dockerfile"
    assert build in DOCKERFILE.read_text(encoding="utf-8")
    deploy = (EXAMPLE / "app.yaml").read_text(encoding="utf-8")
    assert build in deploy and "gcloud app deploy examples/like_app/app.yaml --image-url=" in deploy
    assert build in (ROOT / "README.md").read_text(encoding="utf-8")
