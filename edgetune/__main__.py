"""`python -m edgetune` entry point."""

import sys

from edgetune.cli import main

sys.exit(main())
