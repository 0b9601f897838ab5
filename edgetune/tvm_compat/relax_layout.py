"""Relax layout passes' gaps that edgetune's graph rewrites work around (in edgetune.compiler).

TVM 0.27:
- `relax.transform.ConvertLayout` moves only operators with a layout rule
  (`FRelaxInferLayout`); `relax.clip` has none, so each clip is wrapped in a transpose pair,
  which also splits a convolution from its activation. ConvertLayout fails outright ("Invalid
  SLayout") on a rank-5 `stack`, which the ONNX frontend emits for Max/Min of several tensors,
  and the binary operators' rule gives up on a constant of lower rank than the tensor.
- MetaSchedule's `RewriteLayout` postproc pre-packs a weight that a kernel reorders before its
  reduction (transposed convolutions, a sliced padded dense) with a wrong index map.
No upstream issue found. The rewrites (edgetune.compiler.relax.layout, edgetune.compiler.tir.prepack)
are part of edgetune's compiler and stay there. Test: tests/tvm_compat/test_relax_layout.py
(the clip rule; the others need a model and a tuning run, so tests/compiler covers them).
"""
