"""What a user gets from the package besides the library (issue 23, item 15):
``python -m gds_counter`` works as the ``gds-counter`` command does, and the
Apache-2.0 license setup.cfg declares ships as a file in the repository,
the sdist and the wheel (a licence named but not included is not granted).

The builds run on a copy of the files a build reads, in a temporary
directory, so nothing is written into the checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULE = [sys.executable, "-m", "gds_counter"]
SCRIPT = Path(sys.executable).with_name("gds-counter")
CHOOSERS = ("GDS_URL", "DATASTORE_EMULATOR_HOST", "DATASTORE_PROJECT_ID", "GOOGLE_CLOUD_PROJECT")


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in CHOOSERS}


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=120)


# --- python -m gds_counter ------------------------------------------------------------


def test_python_m_gds_counter_shows_help_under_the_name_it_was_run_by(tmp_path):
    """The usage line is something the user can type back."""
    done = run([*MODULE, "--help"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m gds_counter ")
    script = run([str(SCRIPT), "--help"], tmp_path)
    # the same commands and options, only the name differs
    assert done.stdout.replace("python -m gds_counter", "gds-counter").split() == script.stdout.split()


def test_python_m_gds_counter_counts_and_exits_like_the_command(tmp_path):
    url = f"sqlite:///{tmp_path / 'm.sqlite3'}"
    assert run([*MODULE, "--url", url, "increment", "Counter Test", "1", "-n", "3"], tmp_path).stdout == "3\n"
    assert run([str(SCRIPT), "--url", url, "count", "Counter Test", "1"], tmp_path).stdout == "3\n"  # same storage
    bad = run([*MODULE, "--url", url, "reset", "Counter Test", "1"], tmp_path)  # no --yes, not a terminal
    assert bad.returncode == 2 and bad.stderr.startswith("python -m gds_counter reset: error: ")
    usage = run([*MODULE, "count"], tmp_path)
    assert usage.returncode == 2 and "python -m gds_counter count: error:" in usage.stderr


# --- the license ------------------------------------------------------------------------


def test_the_repository_holds_the_apache_2_license_setup_cfg_declares():
    assert "license = Apache-2.0" in (ROOT / "setup.cfg").read_text()
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text  # the full text, not a pointer
    assert "END OF TERMS AND CONDITIONS" in text


def _source_copy(tmp_path: Path) -> Path:
    """What a build reads from the checkout (without caches)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "gds_counter", src / "gds_counter",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return src


@pytest.mark.slow
def test_the_sdist_holds_the_license(tmp_path):
    """Built with the environment's setuptools (the build backend
    pyproject.toml names), no download needed."""
    src = _source_copy(tmp_path)
    out = tmp_path / "dist"
    build = ("import sys; from setuptools import build_meta; "
             "print(build_meta.build_sdist(sys.argv[1]))")
    done = subprocess.run([sys.executable, "-c", build, str(out)], cwd=src, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    sdist = out / done.stdout.strip().splitlines()[-1]
    with tarfile.open(sdist) as archive:
        names = archive.getnames()
    assert any(name.endswith("/LICENSE") and name.count("/") == 1 for name in names), names
    assert any(name.endswith("/gds_counter/__main__.py") for name in names)


@pytest.mark.slow
def test_the_wheel_holds_the_license_and_python_m(tmp_path):
    """``pip wheel`` as a packager runs it (build isolation fetches the
    build backend; skipped, saying so, only when that cannot be fetched)."""
    src = _source_copy(tmp_path)
    out = tmp_path / "wheels"
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0 and any(sign in done.stderr for sign in (
            "No matching distribution", "Could not find a version", "NewConnectionError", "Network is unreachable")):
        pytest.skip(f"the build backend could not be fetched: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stderr[-2000:]
    [wheel] = out.glob("gds_counter-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        licenses = [n for n in names if ".dist-info/" in n and n.rsplit("/", 1)[-1] == "LICENSE"]
        assert licenses, names
        assert "Apache License" in archive.read(licenses[0]).decode()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "gds_counter/__main__.py" in names
    assert "License-File: LICENSE" in metadata  # installers and scanners find it by this
