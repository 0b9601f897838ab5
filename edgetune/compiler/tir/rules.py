"""edgetune's MetaSchedule schedule rules, registered with TVM by one explicit call.

`prepare` marks a kernel's block with the name of the rule that schedules it; MetaSchedule's
ApplyCustomRule then calls the TVM global function of that name (`rule_function_name`). A process
that makes tuning contexts for prepared modules calls `register_schedule_rules()` first; applying
a database or building needs no rule (a record is a trace).
"""

from __future__ import annotations

import tvm

from edgetune.compiler.tir import convolution, depthwise, integer
from edgetune.compiler.tir.common import rule_function_name

SCHEDULE_RULES = {
    convolution.RULE: convolution.design_spaces,
    depthwise.RULE: depthwise.design_spaces,
    integer.RULE: integer.design_spaces,
}


def register_schedule_rules() -> None:
    """Register every rule of SCHEDULE_RULES with TVM; a rule already registered is kept, so
    calling it again changes nothing."""
    for rule, design_spaces in SCHEDULE_RULES.items():
        name = rule_function_name(rule)
        if tvm.get_global_func(name, allow_missing=True) is None:
            tvm.register_global_func(name, design_spaces)
