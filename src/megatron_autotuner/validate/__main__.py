"""`python -m megatron_autotuner.validate ...` = `mat validate ...` without the rest of the CLI."""

import sys

from .command import main

sys.exit(main())
