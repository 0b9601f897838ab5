"""What a prepared module holds, as the compiler tests read it."""

from __future__ import annotations

import tvm


def kernel_names(prepared: tvm.IRModule) -> list[str]:
    """Every kernel of the module, a tuning task or scheduled by `prepare`."""
    return [gv.name_hint for gv, func in prepared.functions_items() if isinstance(func, tvm.tirx.PrimFunc)]
