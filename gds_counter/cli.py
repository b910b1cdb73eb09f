"""The gds-counter command."""

from __future__ import annotations

import sys

from gds_counter import __version__


def main(argv: list[str] | None = None) -> int:
    print(f"gds-counter {__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
