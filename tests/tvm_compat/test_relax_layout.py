"""edgetune.tvm_compat.relax_layout: Relax's ConvertLayout has no layout rule for clip."""

from __future__ import annotations

import pytest
import tvm


@pytest.mark.xfail(
    strict=True, reason="TVM 0.27: relax.clip has no FRelaxInferLayout, so ConvertLayout wraps it in transposes"
)
def test_clip_has_a_layout_rule():
    assert tvm.ir.Op.get("relax.clip").get_attr("FRelaxInferLayout") is not None


def test_maximum_and_minimum_which_edgetune_rewrites_clips_to_have_one():
    assert all(tvm.ir.Op.get(f"relax.{op}").get_attr("FRelaxInferLayout") is not None for op in ("maximum", "minimum"))
