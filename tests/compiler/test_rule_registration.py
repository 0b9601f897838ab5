"""edgetune's schedule rules reach TVM by `register_schedule_rules()` only: importing the
compiler (and the tuner) registers nothing, and a second call changes nothing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from edgetune.compiler.tir.common import rule_function_name
from edgetune.compiler.tir.rules import SCHEDULE_RULES

pytestmark = pytest.mark.tvm  # the probe imports the compiler and the tuner with TVM: seconds

PROBE = """
import json, sys
import tvm
import edgetune.compiler.prepare, edgetune.compiler.tir.rules, edgetune.tune.tuner
from edgetune.compiler import register_schedule_rules
names = json.loads(sys.argv[1])
def registered():
    return [tvm.get_global_func(name, allow_missing=True) is not None for name in names]
seen = {"imported": registered()}
register_schedule_rules()
seen["registered"] = registered()
register_schedule_rules()
seen["again"] = registered()
print(json.dumps(seen))
"""


def test_importing_the_compiler_registers_no_rule_until_the_call():
    names = [rule_function_name(rule) for rule in SCHEDULE_RULES]
    assert len(names) == 3
    probe = subprocess.run([sys.executable, "-c", PROBE, json.dumps(names)], capture_output=True, text=True, check=True)
    seen = json.loads(probe.stdout.strip().splitlines()[-1])
    assert seen == {"imported": [False] * 3, "registered": [True] * 3, "again": [True] * 3}
