"""What the micro-kernel schedule rules and the kernels scheduled in `prepare` share: the
target's SIMD registers (`vector_unit`), the marks that hand a kernel's block to a rule
(`mark_kernels`, `marking_pass`), the rules' functions for MetaSchedule (`rule_design_spaces`,
`rule_function_name`), the shape of the kernels they take (one convolution block, its input
copy or padding before it, an element-wise epilogue after it) and the folding of that epilogue
into the register tile.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import tvm
from tvm import s_tir
from tvm.target import codegen

from edgetune.compiler.target import target_triple

MIN_ROWS, MAX_ROWS = 4, 8  # pixels of an image row in a register tile
IDLE_SHARE = 32  # a tile longer than every divisor may leave up to 1/IDLE_SHARE of its row idle
MIN_LANES = 4  # the narrowest vector a tile uses (SSE / NEON width)
VECTOR_LANES = "edgetune.vector_lanes"  # block annotations the rules read, set by mark_kernels
VECTOR_REGISTERS = "edgetune.vector_registers"
SCHEDULED = "tirx.is_scheduled"  # a kernel edgetune schedules itself in `prepare`: no tuning task
# CPUs, by LLVM's name, whose AVX-512 units are 256 bits wide: a 512-bit operation is two
# (AMD Zen 4, as its optimization guide describes; LLVM models it for neither znver4 nor znver5,
# whose desktop and server parts compute 512 bits at once).
HALF_WIDTH_DATAPATH_CPUS = frozenset({"znver4"})


@dataclass(frozen=True)
class VectorUnit:
    """The SIMD registers a float32 micro-kernel can use."""

    lanes: int  # float32 per register
    registers: int


def vector_unit(target: tvm.target.Target) -> VectorUnit | None:
    """The target CPU's float32 SIMD registers, or None for targets the rules are not made for."""
    if target.kind.name != "llvm":
        return None
    triple = target_triple(target)
    if triple.startswith("aarch64"):
        return VectorUnit(lanes=4, registers=32)
    if not triple.startswith("x86_64"):
        return None
    if codegen.llvm_cpu_has_features(["avx512f"], target):
        return VectorUnit(lanes=16, registers=32)
    if codegen.llvm_cpu_has_features(["avx2"], target):
        return VectorUnit(lanes=8, registers=16)
    return VectorUnit(lanes=4, registers=16)


def datapath_lanes(target: tvm.target.Target, unit: VectorUnit) -> int:
    """The float32 lanes the target CPU computes per vector operation: a register's (`unit`), or
    half of it on a CPU that executes a 512-bit operation as two 256-bit halves."""
    return unit.lanes // 2 if str(target.attrs.get("mcpu", "")) in HALF_WIDTH_DATAPATH_CPUS else unit.lanes


def is_scheduled(func: object) -> bool:
    """A kernel that `prepare` scheduled itself (Winograd's transforms, concatenations, convolutions
    of one pixel)."""
    return isinstance(func, tvm.tirx.PrimFunc) and func.attrs is not None and bool(func.attrs.get(SCHEDULED, False))


def target_pass(
    transform: Callable[[tvm.IRModule, tvm.target.Target], tvm.IRModule], target: tvm.target.Target, name: str
) -> tvm.transform.Pass:
    """A module pass named `name` that makes `transform(mod, target)` of a module."""
    return tvm.transform.module_pass(lambda mod, _ctx: transform(mod, target), opt_level=0, name=name)


def scheduling_pass(
    target: tvm.target.Target, name: str, schedule: Callable[[tvm.tirx.PrimFunc, VectorUnit], tvm.tirx.PrimFunc | None]
) -> tvm.transform.Pass:
    """A module pass named `name` that replaces each kernel not yet scheduled by what
    `schedule(kernel, the target's vector unit)` makes of it, where it makes one
    (`schedule_kernels`); on a target without a vector unit it changes nothing."""

    def transform(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
        unit = vector_unit(target)
        if unit is None:
            return mod
        return schedule_kernels(mod, lambda func: schedule(func, unit))

    return target_pass(transform, target, name)


def schedule_kernels(
    mod: tvm.IRModule, schedule: Callable[[tvm.tirx.PrimFunc], tvm.tirx.PrimFunc | None]
) -> tvm.IRModule:
    """`mod` with each kernel not yet scheduled replaced by what `schedule` makes of it (a
    kernel marked SCHEDULED), or left as it is where `schedule` gives None."""
    updated = mod
    for global_var, func in mod.functions_items():
        if not isinstance(func, tvm.tirx.PrimFunc) or is_scheduled(func):
            continue
        scheduled = schedule(func)
        if scheduled is None:
            continue
        if updated is mod:
            updated = mod.clone()
        updated[global_var] = scheduled
    return updated


def _annotated_unit(block: tvm.s_tir.SBlock) -> VectorUnit:
    """The vector unit `mark_kernels` recorded on a marked block."""
    return VectorUnit(int(block.annotations[VECTOR_LANES]), int(block.annotations[VECTOR_REGISTERS]))


# finds the block a rule schedules in a kernel (None: the kernel is not the rule's)
BlockFinder = Callable[[s_tir.Schedule, VectorUnit, list], "s_tir.SBlockRV | None"]


def mark_kernels(mod: tvm.IRModule, target: tvm.target.Target, rule: str, find: BlockFinder) -> tvm.IRModule:
    """`mod` with the block that `find` picks in each kernel marked for `rule`; kernels where it
    picks none, and every kernel on a target without a vector unit, are left as they are."""
    unit = vector_unit(target)
    if unit is None:
        return mod
    annotated = mod
    for global_var, func in mod.functions_items():
        kernel = isinstance(func, tvm.tirx.PrimFunc) and isinstance(func.body, s_tir.SBlockRealize)
        if not kernel or is_scheduled(func):
            continue  # not a kernel with a root block, or one `prepare` scheduled: no task
        sch = s_tir.Schedule(func)
        block = find(sch, unit, list(func.params))
        if block is None or "schedule_rule" in sch.get(block).annotations:
            continue
        sch.annotate(block, "schedule_rule", rule)
        sch.annotate(block, VECTOR_LANES, unit.lanes)
        sch.annotate(block, VECTOR_REGISTERS, unit.registers)
        if annotated is mod:
            annotated = mod.clone()
        annotated[global_var] = sch.mod["main"]
    return annotated


def marking_pass(target: tvm.target.Target, rule: str, find: BlockFinder, name: str) -> tvm.transform.Pass:
    """A module pass named `name` that marks the blocks `find` picks for `rule` (`mark_kernels`)."""
    return target_pass(lambda mod, target_: mark_kernels(mod, target_, rule, find), target, name)


def rule_function_name(rule: str) -> str:
    """The TVM global function MetaSchedule's ApplyCustomRule calls for a block marked `rule` on a CPU."""
    return f"s_tir.meta_schedule.cpu.{rule}"


def rule_design_spaces(
    tiles: Callable[[int, int, VectorUnit], list],
    micro_kernel: Callable[[s_tir.Schedule, s_tir.SBlockRV, object, int], None],
) -> Callable[[s_tir.Schedule, s_tir.SBlockRV], list[s_tir.Schedule]]:
    """A rule's function for ApplyCustomRule: its design spaces are `micro_kernel` applied to a
    copy of the schedule for each register tile that `tiles` gives for the output's image
    width and channels on the vector unit the block was marked for, with the lanes of the
    vectors that divide those channels (`channel_lanes`)."""

    def design_spaces(sch: s_tir.Schedule, conv: s_tir.SBlockRV) -> list[s_tir.Schedule]:
        block = sch.get(conv)
        unit = _annotated_unit(block)
        _, _, width, channels = shape(block.writes[0].source)
        lanes = channel_lanes(channels, unit.lanes)
        spaces = []
        for tile in tiles(width, channels, unit):
            space = sch.copy()
            space.seed(sch.fork_seed())
            micro_kernel(space, conv, tile, lanes)
            spaces.append(space)
        return spaces

    return design_spaces


def lone_convolution(
    sch: s_tir.Schedule, params: list, is_input_block: Callable[[s_tir.Schedule, s_tir.SBlockRV], bool]
) -> s_tir.SBlockRV | None:
    """The function's reduction block if the function is one reduction with only input blocks
    (as `is_input_block` says) before it and element-wise blocks over its output after it,
    the last of them writing the function's only output. One of them may be a leading slice of
    it, those after it element-wise over the slice: output channels padded to a vector (a dense
    layer's, edgetune.compiler.relax.layout; a convolution's, edgetune.compiler.relax.channel_padding)."""
    blocks = top_blocks(sch)
    reductions = [b for b in blocks if has_reduction(sch, b)]
    if len(reductions) != 1:
        return None
    conv = reductions[0]
    out_shape = shape(sch.get(conv).writes[0].source)
    position = _position(sch, blocks, conv)
    producers, consumers = blocks[:position], blocks[position + 1 :]
    if not all(is_input_block(sch, b) for b in producers) or not _epilogue(sch, consumers, out_shape):
        return None
    outputs = [b for b in blocks if writes_parameter(sch, b, params)]
    return conv if len(outputs) == 1 and sch.get(outputs[0]).same_as(sch.get(blocks[-1])) else None


def _epilogue(sch: s_tir.Schedule, blocks: list[s_tir.SBlockRV], shape_: tuple[int, ...]) -> bool:
    """Element-wise blocks over the reduction's `shape_`, then at most one leading slice of it
    and element-wise blocks over the slice's shape."""
    for position, block in enumerate(blocks):
        if is_elementwise(sch, block, shape_):
            continue
        if not is_leading_slice(sch, block, shape_):
            return False
        sliced = shape(sch.get(block).writes[0].source)
        return all(is_elementwise(sch, b, sliced) for b in blocks[position + 1 :])
    return True


def convolution_shapes(block: tvm.s_tir.SBlock) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None:
    """(output, data, weight) shapes of a float32 2-d convolution block with static 4-d buffers
    (4 spatial and 3 reduction iterators, data and weight read, one output), or None: the
    micro-kernels' tiles are sized for float32 lanes and static shapes."""
    spatial, reduce = tvm.tirx.IterVar.DataPar, tvm.tirx.IterVar.CommReduce
    if [iv.iter_type for iv in block.iter_vars] != [spatial] * 4 + [reduce] * 3:
        return None
    if len(block.reads) != 2 or len(block.writes) != 1 or block.writes[0].source.dtype != "float32":
        return None
    shapes = tuple(shape(region.source) for region in (block.writes[0], *block.reads))
    if any(len(s) != 4 or None in s for s in shapes):
        return None
    return shapes


def channel_lanes(channels: int, register_lanes: int) -> int | None:
    """The lanes of the widest vector that divides the channels: the register's width, or a
    half or a quarter of it, down to MIN_LANES (24 channels run as 3 vectors of 8 float32 on
    AVX-512); None if none does."""
    widths = (register_lanes, register_lanes // 2, register_lanes // 4)
    return next((lanes for lanes in widths if lanes >= MIN_LANES and channels % lanes == 0), None)


def row_tiles(width: int, tail: bool = False) -> list[int]:
    """Pixel counts of a register tile: divisors of the image width from MIN_ROWS to MAX_ROWS.
    With `tail` (the convolution rule's), the last tile of a row may compute under a predicate:
    a wider row that none divides (13, 26) gets the counts that leave the fewest pixels of its
    last tile idle, and a row whose divisors are all short gets the longer counts that leave at
    most 1/IDLE_SHARE of it idle. Narrower images (the 1x1 maps of squeeze-excitation blocks)
    are left to the stock rules."""
    candidates = range(MIN_ROWS, MAX_ROWS + 1)
    divisors = [rows for rows in candidates if width % rows == 0]
    if not tail or width <= MAX_ROWS:
        return divisors
    idle = {rows: -width % rows for rows in candidates}
    if divisors:
        return divisors + [rows for rows in candidates if rows > max(divisors) and idle[rows] * IDLE_SHARE <= width]
    return [rows for rows in candidates if idle[rows] == min(idle.values())]


def top_blocks(sch: s_tir.Schedule) -> list[s_tir.SBlockRV]:
    """The blocks right under the function's root block."""
    return sch.get_child_blocks(sch.get_sblock(sch.mod["main"].body.block.name_hint))


def has_reduction(sch: s_tir.Schedule, block: s_tir.SBlockRV) -> bool:
    return any(iv.iter_type == tvm.tirx.IterVar.CommReduce for iv in sch.get(block).iter_vars)


def is_elementwise(sch: s_tir.Schedule, block: s_tir.SBlockRV, shape_: tuple[int, ...]) -> bool:
    b = sch.get(block)
    extents = tuple(int(iv.dom.extent) if isinstance(iv.dom.extent, tvm.tirx.IntImm) else None for iv in b.iter_vars)
    spatial = all(iv.iter_type == tvm.tirx.IterVar.DataPar for iv in b.iter_vars)
    return spatial and extents == shape_ and len(b.writes) == 1 and shape(b.writes[0].source) == shape_


def is_leading_slice(sch: s_tir.Schedule, block: s_tir.SBlockRV, shape_: tuple[int, ...]) -> bool:
    """A copy of the first elements of each dimension of a `shape_` buffer: out[i, j] = in[i, j]
    over a smaller shape of the same rank."""
    b = sch.get(block)
    if len(b.reads) != 1 or len(b.writes) != 1 or any(iv.iter_type != tvm.tirx.IterVar.DataPar for iv in b.iter_vars):
        return False
    source, written = shape(b.reads[0].source), shape(b.writes[0].source)
    if source != shape_ or len(written) != len(shape_) or None in written or written == shape_:
        return False
    read = b.reads[0].region
    return all(dim <= full for dim, full in zip(written, shape_)) and all(
        r.min.same_as(iv.var) and int(r.extent) == 1 for r, iv in zip(read, b.iter_vars)
    )


def writes_parameter(sch: s_tir.Schedule, block: s_tir.SBlockRV, params: list) -> bool:
    written = sch.get(block).writes[0].source
    return any(written.same_as(param) for param in params)


def shape(buffer: tvm.tirx.Buffer) -> tuple[int | None, ...]:  # a TensorRegion's source is its buffer
    """The buffer's dimensions, None for each symbolic one (dynamic shapes are never matched)."""
    return tuple(int(dim) if isinstance(dim, tvm.tirx.IntImm) else None for dim in buffer.shape)


def fold_into_tile(
    sch: s_tir.Schedule, conv: s_tir.SBlockRV, inline_padding: bool = True, accumulator_scope: str = "local"
) -> s_tir.SBlockRV:
    """Inline the input blocks (copy, and padding unless `inline_padding` is False) into the
    convolution and the epilogue into one block left after it, which writes the output from
    accumulators in registers (`accumulator_scope` "local", or "global" where a tensor
    intrinsic's description asks for it: both become the tile's stack array). That block is
    returned. A padding block left in place is MetaSchedule's to place (its stock
    RandomComputeLocation rule samples where)."""
    for producer in sch.get_producers(conv):
        block = sch.get(producer)
        if inline_padding or shape(block.reads[0].source) == shape(block.writes[0].source):
            sch.compute_inline(producer)
    blocks = top_blocks(sch)
    *epilogue, output = blocks[_position(sch, blocks, conv) + 1 :] or [None]
    for block in epilogue:
        sch.compute_inline(block)
    if output is None:
        return sch.cache_write(conv, 0, accumulator_scope)
    sch.set_scope(conv, 0, accumulator_scope)
    return output


def write_from_tile(sch: s_tir.Schedule, output: s_tir.SBlockRV, tile_loop: s_tir.LoopRV, lanes: int) -> None:
    """The output block (`fold_into_tile`) computed under `tile_loop`, right after the tile's
    accumulation: its pixels and channel vectors unrolled, its lanes vectorized."""
    sch.reverse_compute_at(output, tile_loop)
    *_, pixels, channels = sch.get_loops(output)
    vectors, lane = sch.split(channels, [None, lanes])
    sch.unroll(pixels)
    sch.unroll(vectors)
    sch.vectorize(lane)


def _position(sch: s_tir.Schedule, blocks: list[s_tir.SBlockRV], block: s_tir.SBlockRV) -> int:
    return next(i for i, b in enumerate(blocks) if sch.get(b).same_as(sch.get(block)))
