"""``python -m gds_counter``: the ``gds-counter`` command, for where the
console script is not on ``PATH`` (a venv that is not activated, or
``pipx run``-less setups). Same arguments, output and exit codes; help and
errors call it ``python -m gds_counter``, so what they show can be typed
back as it is."""

from __future__ import annotations

import sys

from gds_counter.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m gds_counter"))
