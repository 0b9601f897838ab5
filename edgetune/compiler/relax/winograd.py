"""3x3 (and 1 x 3, 1 x 5) stride-1 convolutions computed by Winograd's minimal filtering,
F(4x4, 3x3): an input transform, one pointwise convolution per transformed position (a task of
the convolution rule) and an output transform, both transforms scheduled here.

`winograd_convolutions(target)` is the pipeline's first pass; `pays` says which convolutions it
takes, for `layout: auto` too. docs/compiler.md has the algorithm and the thresholds.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax, s_tir, te, topi
from tvm.topi.nn.winograd_util import _cook_toom_convolution, _interpolation_points

from edgetune.compiler.relax.graph import bound_value, constant_weight, is_call, rewrite_module, static_shape
from edgetune.compiler.tir.common import SCHEDULED, channel_lanes, vector_unit

TILE = 4  # output pixels per tile along a transformed axis: F(4, r)
ROW_KERNELS = (3, 5)  # 1 x r filters of one-dimensional convolutions along a row (Magika's 5 taps)
MIN_CHANNELS = 16  # below this (3-channel stems, 12 -> 24) the transforms outweigh the products saved
# Multiply-adds of one of the products (tiles x input x output channels) below which the
# transforms and the short GEMMs cost more than they save (docs/compiler.md).
MIN_PRODUCT_MACS = 1 << 18
INPUT_KERNEL, OUTPUT_KERNEL = "winograd_input", "winograd_output"
OPAQUE = 8  # relax OpPatternKind kOpaque: Relax fuses nothing into a function already scheduled


@functools.cache
def transform_matrices(kernel: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """F(m, r) along one axis, m = TILE output pixels of an r-tap filter (m = 1 and no transform
    for r = 1): (A: alpha x m, B: alpha x alpha, G: alpha x r), float64, alpha = m + r - 1, such
    that y = At [(G g) * (Bt d)] for a filter g and an input tile d of alpha pixels. Read-only:
    computed once per size (TVM's Cook-Toom construction takes 10 ms)."""
    if kernel == 1:
        matrices = (np.ones((1, 1)), np.ones((1, 1)), np.ones((1, 1)))
    else:
        matrices = tuple(
            np.asarray(m, np.float64)
            for m in _cook_toom_convolution(_interpolation_points(TILE + kernel - 2), TILE, kernel)
        )
    for matrix in matrices:
        matrix.setflags(write=False)
    return matrices


@dataclass(frozen=True)
class Algorithm:
    """F(tile_h x tile_w, kernel_h x kernel_w): the two axes' transforms for a filter's size."""

    kernel: tuple[int, int]

    @property
    def tile(self) -> tuple[int, int]:
        return tuple(TILE if k > 1 else 1 for k in self.kernel)

    @property
    def alpha(self) -> tuple[int, int]:
        return tuple(t + k - 1 for t, k in zip(self.tile, self.kernel))

    @property
    def products(self) -> int:
        """Transformed positions per tile: one product (a GEMM over the tiles) each."""
        return self.alpha[0] * self.alpha[1]

    def matrices(self, axis: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return transform_matrices(self.kernel[axis])


def algorithm_for(kernel: tuple[int, int]) -> Algorithm | None:
    """The algorithm for a filter of `kernel` (height, width): 3 x 3, or a row of ROW_KERNELS taps."""
    if kernel == (3, 3) or (kernel[0] == 1 and kernel[1] in ROW_KERNELS):
        return Algorithm(kernel)
    return None


def winograd_convolutions(target: tvm.target.Target) -> tvm.transform.Pass:
    """The pass that rewrites every eligible convolution (`eligible`) of a module, on targets the
    convolution rule is made for (`vector_unit`)."""
    unit = vector_unit(target)

    def rewrite(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        if unit is None:
            return mod
        return rewrite_module(_Winograd(mod, unit.lanes), mod)

    return tvm.transform.module_pass(rewrite, opt_level=0, name="WinogradConvolutions")


def eligible(call: relax.Call) -> bool:
    """An NHWC convolution with OHWI weights and static shapes that Winograd's algorithm `pays`
    on (its weight must still be a constant)."""
    if not is_call(call, "relax.nn.conv2d"):
        return False
    attrs = call.attrs
    out, data, weight = static_shape(call), static_shape(call.args[0]), static_shape(call.args[1])
    if out is None or data is None or weight is None:
        return False
    if (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout or attrs.data_layout)) != (
        "NHWC",
        "OHWI",
        "NHWC",
    ):
        return False
    return pays(attrs, str(call.ty.dtype), out, weight[3], weight[1:3])


def pays(attrs, dtype: str, out_nhwc: tuple[int, ...], channels_in: int, kernel: tuple[int, int]) -> bool:
    """Whether a convolution (a Relax conv2d's `attrs`, in any layout: its output's dimensions
    given as N, H, W, C) is computed by Winograd's algorithm: float32, groups 1, stride 1,
    dilation 1, a filter `algorithm_for` takes, at least MIN_CHANNELS input and output channels
    and MIN_PRODUCT_MACS per product."""
    algorithm = algorithm_for(tuple(kernel))
    if algorithm is None or dtype != "float32" or int(attrs.groups) != 1:
        return False
    if [int(s) for s in attrs.strides] != [1, 1] or [int(d) for d in attrs.dilation] != [1, 1]:
        return False
    if min(channels_in, out_nhwc[3]) < MIN_CHANNELS:
        return False
    return _Tiles(*out_nhwc[:3], algorithm.tile).count * channels_in * out_nhwc[3] >= MIN_PRODUCT_MACS


def filter_transform(weight: np.ndarray) -> np.ndarray:
    """G g Gt of every filter of an OHWI weight: alpha_h x alpha_w x O x I, float32."""
    algorithm = algorithm_for(weight.shape[1:3])
    (_, _, g_h), (_, _, g_w) = algorithm.matrices(0), algorithm.matrices(1)
    return np.einsum("ak,bl,oklc->aboc", g_h, g_w, weight.astype(np.float64)).astype(np.float32)


def _combine(coefficients: np.ndarray, values: list) -> tvm.tirx.PrimExpr:
    """sum(c * v) over the non-zero coefficients, without multiplying by +-1."""
    total = None
    for c, v in zip(coefficients, values):
        if c == 0:
            continue
        term = v if c == 1 else -v if c == -1 else v * tvm.tirx.const(float(c), "float32")
        total = term if total is None else total + term
    return total if total is not None else tvm.tirx.const(0.0, "float32")


class _Tiles:
    """How an image of `height` x `width` outputs is cut into tiles of `tile` (rows, columns),
    p = (n, th, tw)."""

    def __init__(self, batch: int, height: int, width: int, tile: tuple[int, int]):
        self.batch, self.tile = batch, tile
        self.rows, self.columns = -(-height // tile[0]), -(-width // tile[1])

    @property
    def count(self) -> int:
        return self.batch * self.rows * self.columns

    def split(self, p):
        per_image = self.rows * self.columns
        return p // per_image, (p // self.columns) % self.rows, p % self.columns


def _input_transform(data: te.Tensor, algorithm: Algorithm, tiles: _Tiles, top: int, left: int) -> list[te.Tensor]:
    _, height, width, channels = (int(d) for d in data.shape)
    (tile_h, tile_w), (alpha_h, alpha_w) = algorithm.tile, algorithm.alpha
    bottom = tiles.rows * tile_h + algorithm.kernel[0] - 1 - height - top
    right = tiles.columns * tile_w + algorithm.kernel[1] - 1 - width - left
    padded = topi.nn.pad(data, [0, top, left, 0], [0, bottom, right, 0], name="winograd_pad")
    (_, b_h, _), (_, b_w, _) = algorithm.matrices(0), algorithm.matrices(1)

    def positions(_n, _h, p, c):
        n, th, tw = tiles.split(p)
        d = [[padded[n, th * tile_h + i, tw * tile_w + j, c] for j in range(alpha_w)] for i in range(alpha_h)]
        rows = [[_combine(b_w[:, nu], d[i]) for nu in range(alpha_w)] for i in range(alpha_h)]  # d B
        return [
            _combine(b_h[:, xi], [rows[i][nu] for i in range(alpha_h)])
            for xi in range(alpha_h)
            for nu in range(alpha_w)
        ]

    return te.compute((1, 1, tiles.count, channels), positions, name=INPUT_KERNEL)


def _output_transform(products: list[te.Tensor], algorithm: Algorithm, tiles: _Tiles) -> te.Tensor:
    """At m A of every tile: N x tile rows x tile_h x tile columns x tile_w x output channels.
    The coefficients depend on the output pixel (vh, vw) in the tile: an expression chooses
    among the tile's sums of the non-zero terms, which the schedule's unrolled vh and vw make
    constant."""
    channels = int(products[0].shape[3])
    (tile_h, tile_w), (alpha_h, alpha_w) = algorithm.tile, algorithm.alpha
    (a_h, _, _), (a_w, _, _) = algorithm.matrices(0), algorithm.matrices(1)

    def value(n, th, vh, tw, vw, c):
        p = (n * tiles.rows + th) * tiles.columns + tw
        m = [[products[xi * alpha_w + nu][0, 0, p, c] for nu in range(alpha_w)] for xi in range(alpha_h)]
        columns = [[_combine(a_w[:, w], m[xi]) for w in range(tile_w)] for xi in range(alpha_h)]  # m A
        sums = [
            [_combine(a_h[:, h], [columns[xi][w] for xi in range(alpha_h)]) for w in range(tile_w)]
            for h in range(tile_h)
        ]
        return _choose(vh, [_choose(vw, row) for row in sums])

    shape = (tiles.batch, tiles.rows, tile_h, tiles.columns, tile_w, channels)
    return te.compute(shape, value, name=OUTPUT_KERNEL)


def _choose(index, values: list) -> tvm.tirx.PrimExpr:
    """values[index] for a loop variable `index`, as a chain of selects."""
    chosen = values[-1]
    for i in reversed(range(len(values) - 1)):
        chosen = tvm.tirx.Select(index == i, values[i], chosen)
    return chosen


def _scheduled(inputs: list[te.Tensor], out, order, lanes: int) -> tvm.tirx.PrimFunc:
    """A transform's kernel, scheduled here (MetaSchedule does not tune it, Relax fuses nothing
    into it): its last block's channel loop split into vectors of the target's lanes, the loops
    above the vectors (the outer channel loop last) arranged by `order(sch, loops)`."""
    outputs = list(out) if isinstance(out, (list, tuple)) else [out]
    sch = s_tir.Schedule(te.create_prim_func([*inputs, *outputs]))
    block = sch.get_child_blocks(sch.get_sblock("root"))[-1]
    *loops, channel = sch.get_loops(block)
    channels = int(outputs[0].shape[-1])
    channel_outer, lane = sch.split(channel, [None, channel_lanes(channels, lanes) or 1])
    order(sch, [*loops, channel_outer])
    sch.vectorize(lane)
    func = sch.mod["main"].without_attr("global_symbol")
    return func.with_attrs({SCHEDULED: True, "op_pattern": OPAQUE})


def _input_kernel(
    data_shape, algorithm: Algorithm, tiles: _Tiles, top: int, left: int, lanes: int
) -> tvm.tirx.PrimFunc:
    """The input transform, the tiles in parallel, the padding computed into a buffer first."""
    data = te.placeholder(data_shape, "float32", "data")

    def order(sch, loops):
        sch.parallel(loops[2])  # the tiles

    return _scheduled([data], _input_transform(data, algorithm, tiles, top, left), order, lanes)


def _output_kernel(product_shape, algorithm: Algorithm, tiles: _Tiles, lanes: int) -> tvm.tirx.PrimFunc:
    """The output transform: the tile's pixels unrolled, so that each is its own sum of
    constant multiples of the products (`_output_transform`)."""
    products = [te.placeholder(product_shape, "float32", f"m{k}") for k in range(algorithm.products)]

    def order(sch, loops):
        n, th, vh, tw, vw, c = loops
        sch.reorder(n, th, tw, c, vh, vw)
        sch.parallel(sch.fuse(n, th))
        sch.unroll(vh)
        sch.unroll(vw)

    return _scheduled(products, _output_transform(products, algorithm, tiles), order, lanes)


@relax.expr_functor.mutator
class _Winograd(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, lanes: int):
        super().__init__(mod)
        self._lanes = lanes

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not eligible(call):
            return call
        weight = constant_weight(bound_value(self, call.args[1]))
        return call if weight is None else self._winograd(call, weight)

    def _winograd(self, call: relax.Call, weight: np.ndarray) -> relax.Expr:
        algorithm = algorithm_for(weight.shape[1:3])
        batch, height, width, channels_out = static_shape(call)
        tiles = _Tiles(batch, height, width, algorithm.tile)
        top, left = (int(p) for p in call.attrs.padding[:2])
        data = call.args[0]
        data_shape = static_shape(data)
        input_kernel = self.builder_.add_func(
            _input_kernel(data_shape, algorithm, tiles, top, left, self._lanes), INPUT_KERNEL
        )
        position_type = relax.TensorType((1, 1, tiles.count, data_shape[3]), "float32")
        positions = self.builder_.emit(relax.call_tir(input_kernel, [data], [position_type] * algorithm.products))
        filters = filter_transform(weight)
        products = [
            self.builder_.emit(
                relax.op.nn.conv2d(
                    relax.TupleGetItem(positions, xi * algorithm.alpha[1] + nu),
                    relax.const(filters[xi, nu][:, None, None, :]),
                    data_layout="NHWC",
                    kernel_layout="OHWI",
                )
            )
            for xi in range(algorithm.alpha[0])
            for nu in range(algorithm.alpha[1])
        ]
        output_kernel = _output_kernel((1, 1, tiles.count, channels_out), algorithm, tiles, self._lanes)
        kernel = self.builder_.add_func(output_kernel, OUTPUT_KERNEL)
        (tile_h, tile_w) = algorithm.tile
        shape = (batch, tiles.rows, tile_h, tiles.columns, tile_w, channels_out)
        grid = self.builder_.emit(relax.call_tir(kernel, products, relax.TensorType(shape, "float32")))
        image = relax.op.reshape(grid, (batch, tiles.rows * tile_h, tiles.columns * tile_w, channels_out))
        if (tiles.rows * tile_h, tiles.columns * tile_w) == (height, width):
            return image
        return relax.op.strided_slice(image, axes=[1, 2], begin=[0, 0], end=[height, width])
