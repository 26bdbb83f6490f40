"""``python -m reshard.pipeline``: print :func:`reshard.pipeline.compare_schedules` tables.

Options: ``--stages``, ``--microbatches``, ``--forward``, ``--backward``,
``--transfer T [T ...]``, ``--schedules NAME [NAME ...]``, ``--paper`` (see
``--help``). A bad value ends in one line naming it and exit code 2, no traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from reshard.core.errors import ReshardError
from reshard.pipeline.compare import main


def run(argv: Sequence[str] | None = None) -> int:
    """Run the comparison; the exit code (2 for a bad value)."""
    try:
        main(argv)
    except ReshardError as e:
        print(f"python -m reshard.pipeline: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(run())
