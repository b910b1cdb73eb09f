"""google-cloud-firestore is an optional extra: imported only when a
``firestore://`` gateway is opened, and without it a ``GDSError`` says how
to install it. Each check runs in a fresh interpreter (a real subprocess),
where what is imported can be seen and a package can be made missing."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("FIRESTORE_EMULATOR_HOST", None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_the_firestore_client_is_not_imported_until_a_firestore_gateway_is_opened():
    done = run(
        "import sys, gds_counter, gds_counter.aio\n"
        "from gds_counter.gateway import open_gateway\n"
        "open_gateway('memory://').close()\n"
        "print(sorted(m for m in sys.modules if m.startswith('google.cloud.firestore')))\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_without_the_extra_a_firestore_url_says_how_to_install_it():
    done = run(
        "import sys\n"
        "sys.modules['google.cloud.firestore_v1'] = None  # as if google-cloud-firestore were not installed\n"
        "from gds_counter import GDSError\n"
        "from gds_counter.gateway import open_gateway\n"
        "try:\n"
        "    open_gateway('firestore://my-project')\n"
        "except GDSError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("GatewayError ") and "pip install -e '.[firestore]'" in done.stdout


def test_setup_cfg_declares_the_firestore_extra_and_dev_includes_it():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    extras = config["options.extras_require"]
    assert "google-cloud-firestore>=2.16" in extras["firestore"].split()
    assert "google-cloud-firestore>=2.16" in extras["dev"].split()
