"""`python -m edgetune.agent`: the board agent's command line, in a process of its own.

The agent loads and runs libraries and compiles nothing, so unless the board's environment says
otherwise, TVM loads its runtime library alone (`TVM_USE_RUNTIME_LIB=1`, read by `tvm.base` when
TVM is first imported), without its compiler library. The agent's reference-check child and
hooks inherit it.
"""

import os
import sys

os.environ.setdefault("TVM_USE_RUNTIME_LIB", "1")

from edgetune.agent.cli import main  # noqa: E402 (after the variable: nothing may import TVM before it)

sys.exit(main())
