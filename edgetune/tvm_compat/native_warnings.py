"""TVM's C++ warnings, told apart from the rest of the output on file descriptor 2.

TVM 0.27's C++ `LOG(WARNING)` writes straight to file descriptor 2, past Python's `logging`
and `sys.stderr`, with no hook to route it (only MetaSchedule's `TVM_PY_LOG` lines go to a
Python logger). What it warns about during tuning means nothing to a user (`Unknown schedule
rule "meta_schedule.pool_max"` for every pooling kernel, as meant). No upstream issue found.
edgetune.tune.native_log routes descriptor 2 through a pipe and sends the lines
`is_tvm_warning` matches to the run's log. Test: tests/tvm_compat/test_native_warnings.py.
"""

from __future__ import annotations

import re

# `[02:26:14] /project/src/.../apply_custom_rule.cc:64: Warning: ...` (TVM's LOG(WARNING))
_TVM_WARNING = re.compile(rb"^\[\d\d:\d\d:\d\d\] \S+:\d+: Warning: ")


def is_tvm_warning(line: bytes) -> bool:
    return bool(_TVM_WARNING.match(line))
