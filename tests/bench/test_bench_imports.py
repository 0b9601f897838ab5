"""Every bench script still imports: a name that moved in the package breaks a bench that no
test runs end to end (their runs take hours), so each module is loaded, not run, here."""

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"

LOAD_EACH = """
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
"""


def test_every_bench_script_imports():
    scripts = sorted(p.stem for p in BENCH.glob("*.py"))
    assert len(scripts) > 10
    done = subprocess.run(
        [sys.executable, "-c", LOAD_EACH, *scripts], cwd=BENCH, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
