"""``python -m reshard.microbench`` is ``reshard-bench``."""

import sys

from reshard.microbench.cli import main

if __name__ == "__main__":
    sys.exit(main())
