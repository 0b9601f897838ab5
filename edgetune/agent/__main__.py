"""`python -m edgetune.agent`: the board agent's command line."""

import sys

from edgetune.agent.cli import main

sys.exit(main())
