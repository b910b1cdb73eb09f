"""``python -m gds_counter.cli``: the ``gds-counter`` command (as ``python -m
gds_counter``, which names itself in help and errors)."""

from __future__ import annotations

import sys

from gds_counter.cli import main

if __name__ == "__main__":
    sys.exit(main())
