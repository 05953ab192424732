"""`python -m simulator ...` is `llm-health sim ...`."""

import sys

from simulator.cli import main

sys.exit(main())
