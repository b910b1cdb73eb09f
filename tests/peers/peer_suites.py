"""The official Python clients' own system tests, against ``gds-counter
serve`` and against the Firestore emulator in Datastore mode.

    python tests/peers/peer_suites.py [--suite datastore,ndb] [--transport grpc,rest]
                                      [--target serve,emulator] [--ndb-src DIR]
                                      [--work DIR] [--record FILE] [--against FILE]

Each suite is run as its own repository runs it against an emulator
(``DATASTORE_EMULATOR_HOST``, ``DATASTORE_DATASET``, pytest on
``tests/system``), from its public sources, never committed here:

* **datastore**: googleapis/python-datastore's ``tests/system``, taken from
  the source distribution of the google-cloud-datastore installed here
  (``pip download --no-binary``), run by this interpreter, over gRPC and over
  REST (``GOOGLE_CLOUD_DISABLE_GRPC=True``, binary protobuf), the two
  variants its repository runs;
* **ndb**: googleapis/python-ndb's ``tests/system``, which its source
  distribution does not ship: ``--ndb-src`` names a checkout of its
  repository, installed with its tests' needs into a virtual environment of
  its own under ``--work`` (ndb talks gRPC only).

``serve`` is ``gds-counter serve --port 0 --url memory://``, a fresh process
per run; ``emulator`` the official Firestore emulator in Datastore mode
(``gds_counter.emulators``). The outcome of each test (passed, failed,
skipped) is read from pytest's JUnit XML. ``--record FILE`` writes them
(JSON, beside the clients' versions); ``--against FILE`` takes the emulator's
outcomes from such a record instead of running it (tests/peers/test_peer_suites.py
does that in CI). The exit status is 1 when a test that passed on the
emulator (in every recorded run) did not pass on serve, 2 when there was
nothing to compare serve with. python-datastore's suite needs pytest and
google-cloud-testutils beside the client (this project's ``dev`` extra);
each run's pytest output is kept beside its JUnit XML under ``--work``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

SUITES = ("datastore", "ndb")
TRANSPORTS = ("grpc", "rest")
TARGETS = ("serve", "emulator")
#: The project id the suites' clients use (their ``DATASTORE_DATASET``).
PROJECT = "peer-suites"
#: The longest a suite may run on one target.
SUITE_TIMEOUT_S = 1800


def datastore_suite(work: Path) -> Path:
    """python-datastore's source tree for the google-cloud-datastore
    installed here (its sdist ships ``tests/system``), extracted under
    ``work`` once."""
    version = metadata.version("google-cloud-datastore")
    root = work / f"google_cloud_datastore-{version}"
    if (root / "tests" / "system").is_dir():
        return root
    with tempfile.TemporaryDirectory() as download:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                        f"google-cloud-datastore=={version}", "-d", download], check=True)
        [archive] = Path(download).glob("*.tar.gz")
        with tarfile.open(archive) as sdist:
            sdist.extractall(work, filter="data")
    return root


def ndb_python(source: Path, work: Path) -> str:
    """A Python with python-ndb installed from ``source`` (its checkout),
    and what its system tests import."""
    venv = work / "ndb-venv"
    python = venv / "bin" / "python"
    marker = venv / "installed-from"
    if not (marker.exists() and marker.read_text() == str(source.resolve())):
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", str(source), "pytest",
                        "google-cloud-testutils", "requests"], check=True)
        marker.write_text(str(source.resolve()))
    return str(python)


class _Serve:
    """``gds-counter serve`` in a process of its own on a free port."""

    def __enter__(self) -> str:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gds_counter", "serve", "--port", "0", "--url", "memory://"],
            stderr=subprocess.PIPE, text=True)
        assert self.process.stderr is not None
        line = self.process.stderr.readline()
        found = re.search(r"DATASTORE_EMULATOR_HOST=(\S+)", line)
        if found is None:
            self.process.kill()
            raise RuntimeError(f"gds-counter serve did not start: {line!r}")
        return found.group(1)

    def __exit__(self, *_: object) -> None:
        self.process.terminate()
        self.process.wait(30)


class _Emulator:
    """The official Firestore emulator in Datastore mode."""

    def __enter__(self) -> str:
        from gds_counter.emulators import launch_emulator

        self.emulator = launch_emulator("firestore", project=PROJECT)
        return self.emulator.host

    def __exit__(self, *_: object) -> None:
        self.emulator.stop()


def outcomes(junit: Path) -> dict[str, str]:
    """Each test's outcome in a JUnit XML file: ``passed``, ``failed``
    (a failure, or an error in its setup or teardown) or ``skipped``."""
    found: dict[str, str] = {}
    for case in ET.parse(junit).iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
            elif child.tag == "skipped" and outcome == "passed":
                outcome = "skipped"
        if found.get(name) != "failed":  # a teardown error is a second entry of the same test
            found[name] = outcome
    return found


def run_suite(python: str, root: Path, host: str, transport: str, junit: Path) -> dict[str, str]:
    """The suite in ``root`` against the server at ``host``, as its
    repository runs it against an emulator."""
    env = {k: v for k, v in os.environ.items() if k not in ("GDS_URL", "GOOGLE_CLOUD_DISABLE_GRPC")}
    env.update(DATASTORE_EMULATOR_HOST=host, DATASTORE_DATASET=PROJECT, DATASTORE_PROJECT_ID=PROJECT,
               GOOGLE_CLOUD_PROJECT=PROJECT, PYTHONDONTWRITEBYTECODE="1")
    if transport == "rest":
        env["GOOGLE_CLOUD_DISABLE_GRPC"] = "True"
    log = junit.with_suffix(".log")
    with open(log, "wb") as out:
        subprocess.run([python, "-m", "pytest", "tests/system", "-q", "-p", "no:cacheprovider", "-p", "no:gds_counter",
                        f"--junitxml={junit}"],
                       cwd=root, env=env, timeout=SUITE_TIMEOUT_S, stdout=out, stderr=subprocess.STDOUT)
    if not junit.exists():
        tail = log.read_text(errors="replace")[-2000:]
        raise SystemExit(f"the suite in {root} did not run (its output: {log}):\n{tail}")
    return outcomes(junit)


def check_prerequisites() -> None:
    """What python-datastore's suite imports, beside the client: pytest and
    google-cloud-testutils (both in this project's ``dev`` extra)."""
    missing = [package for module, package in (("pytest", "pytest"), ("test_utils", "google-cloud-testutils"))
               if importlib.util.find_spec(module) is None]
    if missing:
        raise SystemExit(f"python-datastore's system tests need {' and '.join(missing)}: "
                         f"pip install {' '.join(missing)} (or this project's dev extra)")


def runs(suites: list[str], transports: list[str], targets: list[str], work: Path,
         ndb_src: Path | None) -> Iterator[tuple[str, str, str, dict[str, str], float]]:
    """(suite, transport, target, outcomes, seconds) of each run asked for."""
    for suite in suites:
        if suite == "datastore":
            check_prerequisites()
            python, root, suite_transports = sys.executable, datastore_suite(work), transports
        else:
            if ndb_src is None:
                raise SystemExit("the ndb suite needs --ndb-src: a checkout of github.com/googleapis/python-ndb")
            python, root, suite_transports = ndb_python(ndb_src, work), ndb_src, ["grpc"]
        for transport in suite_transports:
            for target in targets:
                with (_Serve() if target == "serve" else _Emulator()) as host:
                    started = time.monotonic()
                    found = run_suite(python, root, host, transport, work / f"{suite}-{transport}-{target}.xml")
                    yield suite, transport, target, found, time.monotonic() - started


def regressions(emulator: list[dict[str, str]], serve: dict[str, str]) -> list[str]:
    """Tests that passed on the emulator in every run of ``emulator`` and
    did not pass on serve: failed, skipped, or not run at all (a module that
    could not be imported runs none of its tests)."""
    if not emulator:
        return []
    return sorted(name for name in emulator[0]
                  if all(run.get(name) == "passed" for run in emulator) and serve.get(name) != "passed")


def _counts(found: dict[str, str]) -> str:
    return ", ".join(f"{sum(1 for o in found.values() if o == kind)} {kind}" for kind in ("passed", "failed", "skipped"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default="datastore", help="datastore, ndb, or both (comma-separated)")
    parser.add_argument("--transport", default="grpc,rest", help="grpc, rest, or both (the datastore suite)")
    parser.add_argument("--target", default="serve,emulator", help="serve, emulator, or both")
    parser.add_argument("--ndb-src", type=Path, help="a checkout of github.com/googleapis/python-ndb")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "gds-counter-peer-suites")
    parser.add_argument("--record", type=Path, help="write the outcomes to this JSON file (added to what it holds)")
    parser.add_argument("--against", type=Path, help="take the emulator's outcomes from this record")
    args = parser.parse_args(argv)
    pick = {"suite": SUITES, "transport": TRANSPORTS, "target": TARGETS}
    chosen = {}
    for option, allowed in pick.items():
        chosen[option] = [part for part in getattr(args, option).split(",") if part]
        unknown = set(chosen[option]) - set(allowed)
        if unknown or not chosen[option]:
            parser.error(f"--{option} takes {', '.join(allowed)}, got {getattr(args, option)!r}")
    args.work.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = json.loads(args.record.read_text()) if args.record and args.record.exists() else {}
    recorded: dict[str, Any] = json.loads(args.against.read_text()) if args.against else {}
    results: dict[tuple[str, str], dict[str, list[dict[str, str]]]] = {}
    for suite, transport, target, found, seconds in runs(chosen["suite"], chosen["transport"], chosen["target"],
                                                        args.work, args.ndb_src):
        print(f"{suite} over {transport} on {target}: {_counts(found)} in {seconds:.0f} s", flush=True)
        results.setdefault((suite, transport), {}).setdefault(target, []).append(found)
        if args.record:
            entry = record.setdefault(suite, {}).setdefault(transport, {}).setdefault(target, [])
            entry.append({"when": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"), "seconds": round(seconds),
                          "client": metadata.version("google-cloud-datastore") if suite == "datastore" else "source",
                          "outcomes": found})
            args.record.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    status = 0
    for (suite, transport), by_target in results.items():
        emulator_runs = by_target.get("emulator") or [
            run["outcomes"] for run in recorded.get(suite, {}).get(transport, {}).get("emulator", [])]
        if by_target.get("serve") and not emulator_runs:
            print(f"{suite} over {transport}: no emulator outcomes to compare with (add --target emulator, or "
                  "--against docs/peer_suites.json)")
            status = max(status, 2)
            continue
        for serve in by_target.get("serve", []):
            worse = regressions(emulator_runs, serve)
            if worse:
                status = 1
            print(f"{suite} over {transport}: {len(worse)} test(s) pass on the emulator and not on serve"
                  + "".join(f"\n  {name}" for name in worse))
    return status


if __name__ == "__main__":
    sys.exit(main())
