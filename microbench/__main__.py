"""``python -m reshard.microbench`` is ``reshard-bench``."""

import sys

from reshard.microbench.cli import main

sys.exit(main())
