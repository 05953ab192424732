"""`python -m llm_health.simulator ...` is `llm-health sim ...`."""

import sys

from llm_health.simulator.cli import main

sys.exit(main())
