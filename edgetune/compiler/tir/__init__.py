"""The TIR side of edgetune's compiler: the fused kernels `prepare` schedules itself
(concatenations, convolutions of one pixel), the weights left unpacked (`prepack`), and the
MetaSchedule schedule rules (convolution, depthwise, integer) with the marks that hand kernels
to them. `common` holds what they share; `rules` registers the rules with TVM."""
