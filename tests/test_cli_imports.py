"""The command line loads only what the verb it runs needs: `edgetune check`, `plan --help` or
`rollout` start without importing TVM, whose import costs a second of CPU in every process."""

from __future__ import annotations

import subprocess
import sys


def test_the_command_line_imports_no_tvm_until_a_verb_needs_it():
    probe = "import sys, edgetune.cli; print(sorted(m for m in sys.modules if m == 'tvm' or m.startswith('tvm.')))"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert loaded.stdout.strip() == "[]", loaded.stdout
