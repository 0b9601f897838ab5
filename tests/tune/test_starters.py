"""Starter records without a fleet: the tile adaptation, the kernel signature, a schedule
transferred to another shape (built and run against NumPy), and `edgetune starters build`."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import tvm
import tvm_ffi
from hypothesis import given
from hypothesis import strategies as st
from tvm import te
from tvm.s_tir import meta_schedule as ms

from edgetune.cli import main
from edgetune.tune.borrow import EXACT, TRANSFER
from edgetune.tune.database import ClassDatabasePaths
from edgetune.tune.starters import StarterTraces, adapt_tile, shape_distance, signature

ROOT = Path(__file__).resolve().parents[2]
TARGET = {"kind": "llvm", "mcpu": "x86-64-v3", "num-cores": 1}


@given(
    factors=st.lists(st.integers(1, 128), min_size=1, max_size=5),
    extent=st.integers(1, 4096),
    max_innermost=st.sampled_from([-1, 0, 1, 4, 16, 64]),
)
def test_an_adapted_tile_multiplies_to_the_extent_within_the_innermost_bound(factors, extent, max_innermost):
    tile = adapt_tile(factors, extent, max_innermost)
    assert len(tile) == len(factors) and all(f >= 1 for f in tile)
    assert math.prod(tile) == extent
    if len(tile) > 1 and max_innermost > 0:
        assert tile[-1] <= max_innermost


@given(factors=st.lists(st.integers(1, 64), min_size=2, max_size=5), max_innermost=st.sampled_from([-1, 64]))
def test_a_tile_for_its_own_extent_is_kept(factors, max_innermost):
    assert adapt_tile(factors, math.prod(factors), max_innermost) == factors


def test_inner_factors_that_still_divide_are_kept_and_the_outermost_takes_the_rest():
    assert adapt_tile([4, 8, 1, 2], 48, 64) == [3, 8, 1, 2]
    assert adapt_tile([32, 8], 60, 64) == [10, 6]  # 8 does not divide 60: its largest divisor below 8
    assert adapt_tile([1, 128], 256, 64) == [4, 64]  # the innermost bound


def matmul_relu(m: int, n: int, k: int, a_name: str = "A", dtype: str = "float32") -> tvm.IRModule:
    a = te.placeholder((m, k), name=a_name, dtype=dtype)
    b = te.placeholder((k, n), name="B", dtype=dtype)
    r = te.reduce_axis((0, k), name="k")
    product = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="matmul")
    relu = te.compute((m, n), lambda i, j: te.max(product[i, j], tvm.tirx.const(0, dtype)), name="relu")
    return tvm.IRModule({"main": te.create_prim_func([a, b, relu])})


def add(m: int, n: int) -> tvm.IRModule:
    a, b = te.placeholder((m, n), name="A"), te.placeholder((m, n), name="B")
    return tvm.IRModule({"main": te.create_prim_func([a, b, te.compute((m, n), lambda i, j: a[i, j] + b[i, j])])})


@pytest.mark.tvm
def test_the_signature_matches_a_kernel_of_the_same_kind_at_other_shapes_only():
    assert signature(matmul_relu(64, 128, 256)) == signature(matmul_relu(1, 10, 784))
    assert signature(matmul_relu(64, 128, 256)) != signature(add(64, 128))
    # the names a model's import numbers its values by do not tell kernels apart; dtypes do
    assert signature(matmul_relu(64, 128, 256, a_name="lv12")) == signature(matmul_relu(8, 8, 8, a_name="lv3407"))
    assert signature(matmul_relu(64, 128, 256, dtype="int8")) != signature(matmul_relu(64, 128, 256))
    near, far = [0, 64, 128, 256], [0, 1, 10, 784]
    assert shape_distance(near, [0, 48, 96, 200]) < shape_distance(far, [0, 48, 96, 200])


# (i tiles, j tiles, k tiles) of the records of the 64 x 256 by 256 x 128 matmul, by seed
MATMUL_TILES = (
    ([4, 2, 2, 4], [4, 2, 2, 8], [32, 8]),
    ([2, 4, 1, 8], [2, 2, 4, 8], [64, 4]),
    ([8, 1, 2, 4], [1, 4, 4, 8], [16, 16]),
)


def sampled_schedule(mod: tvm.IRModule, seed: int) -> tvm.s_tir.Schedule:
    """A schedule as MetaSchedule's CPU rules and postprocessors make one: sampled tiles of the
    loops, the reduction in the middle, the outer loops fused and parallel, the innermost
    vectorized, the element-wise consumer fused and vectorized, the reduction's init split out."""
    sch = tvm.s_tir.Schedule(mod)
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    if len(blocks) == 1:  # the element-wise add
        fused = sch.fuse(*sch.get_loops(blocks[0]))
        outer, inner = sch.split(
            fused, sch.sample_perfect_tile(fused, n=2, max_innermost_factor=64, decision=[128, 64])
        )
        sch.parallel(outer)
        sch.vectorize(inner)
        return sch
    product, relu = blocks
    i, j, k = sch.get_loops(product)
    tiles_i, tiles_j, tiles_k = MATMUL_TILES[seed % len(MATMUL_TILES)]
    i0, i1, i2, i3 = sch.split(i, sch.sample_perfect_tile(i, n=4, max_innermost_factor=64, decision=tiles_i))
    j0, j1, j2, j3 = sch.split(j, sch.sample_perfect_tile(j, n=4, max_innermost_factor=64, decision=tiles_j))
    k0, k1 = sch.split(k, sch.sample_perfect_tile(k, n=2, max_innermost_factor=64, decision=tiles_k))
    sch.reorder(i0, j0, i1, j1, k0, i2, j2, k1, i3, j3)
    sch.reverse_compute_at(relu, j1)
    sch.parallel(sch.fuse(i0, j0))
    sch.vectorize(j3)
    sch.vectorize(sch.get_loops(relu)[-1])
    sch.decompose_reduction(product, k0)
    return sch


def tiles(trace: tvm.s_tir.schedule.Trace) -> list[list[int]]:
    return [[int(f) for f in trace.decisions[i]] for i in trace.insts if i.kind.name == "SamplePerfectTile"]


@pytest.fixture(scope="module")
def starter_db(tmp_path_factory) -> Path:
    """A class database of one matmul + relu (64 x 256 by 256 x 128) with three measured
    records and a failed one, and an element-wise add with one."""
    directory = tmp_path_factory.mktemp("class-db")
    paths = ClassDatabasePaths(directory)
    database = ms.database.JSONDatabase(str(paths.workload), str(paths.tuning_record), allow_missing=True)
    target = tvm.target.Target(TARGET)
    for mod, seconds in ((matmul_relu(64, 128, 256), (3e-4, 1e-4, 1e10, 2e-4)), (add(64, 128), (5e-5,))):
        workload = database.commit_workload(mod)
        for seed, secs in enumerate(seconds):
            sch = sampled_schedule(mod, seed)
            args = ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True)
            database.commit_tuning_record(ms.database.TuningRecord(sch.trace, workload, [secs], target, args))
    return directory


@pytest.mark.tvm
def test_a_trace_transferred_to_other_shapes_builds_and_computes_the_kernel(starter_db):
    starters = StarterTraces.open(starter_db)
    task = matmul_relu(60, 96, 200)  # no extent the same, 60 not divisible by the donor's tiles
    found = starters.seeds(task, 8)
    assert found is not None and found.how == TRANSFER
    assert len(found.schedules) == 3  # the three measured records, each a module of its own
    assert len({tvm_ffi.structural_hash(s.mod) for s in found.schedules}) == len(found.schedules)
    a = np.random.default_rng(0).standard_normal((60, 200)).astype("float32")
    b = np.random.default_rng(1).standard_normal((200, 96)).astype("float32")
    for sch in found.schedules:
        assert all(math.prod(t) in (60, 96, 200) for t in tiles(sch.trace))
        kernel = tvm.compile(sch.mod, target=tvm.target.Target(TARGET))
        out = tvm.runtime.tensor(np.zeros((60, 96), "float32"))
        kernel(tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
        np.testing.assert_allclose(out.numpy(), np.maximum(a @ b, 0), rtol=1e-4, atol=1e-4)


@pytest.mark.tvm
def test_a_kernel_the_starters_hold_is_seeded_exactly_and_an_unknown_kind_not_at_all(starter_db):
    starters = StarterTraces.open(starter_db)
    same = starters.seeds(matmul_relu(64, 128, 256), 2)
    assert same is not None and same.how == EXACT and len(same.schedules) == 2
    a = te.placeholder((8, 8), name="A")
    scale = tvm.IRModule({"main": te.create_prim_func([a, te.compute((8, 8), lambda i, j: a[i, j] * 2.0)])})
    assert starters.seeds(scale, 2) is None


def run_cli(*argv) -> tuple[int, str, str]:
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


@pytest.mark.tvm
def test_starters_build_keeps_the_best_k_measured_records_of_each_kernel(starter_db, tmp_path):
    out = tmp_path / "starters" / "x86-64-v3"
    code, stdout, stderr = run_cli(
        "starters",
        "build",
        "--profile",
        "x86-64-v3",
        "--from",
        starter_db,
        "--top-k",
        2,
        "--out",
        out,
        "-f",
        ROOT / "fleet.yaml",
    )
    assert code == 0, stderr
    assert f"{out}: 3 records of 2 kernels" in stdout
    paths = ClassDatabasePaths(out)
    written = ms.database.JSONDatabase(str(paths.workload), str(paths.tuning_record))  # TVM reads it
    by_kernel = {}
    for record in written.get_all_tuning_records():
        by_kernel.setdefault(signature(record.workload.mod), []).append(float(record.run_secs[0]))
    assert sorted(by_kernel.values()) == [[5e-5], [1e-4, 2e-4]]  # the failed record is never kept


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"--from": "{tmp}/missing"}, "{tmp}/missing: no such directory"),
        ({"--from": "{tmp}/empty"}, "{tmp}/empty: not a class database directory: it has no database_workload.json"),
        ({"--profile": "rpi9"}, "--profile 'rpi9': no device class of"),
    ],
)
def test_starters_build_refuses_bad_input_by_name_and_writes_nothing(tmp_path, change, message):
    (tmp_path / "empty").mkdir()
    (tmp_path / "db").mkdir()
    for path in (ClassDatabasePaths(tmp_path / "db").workload, ClassDatabasePaths(tmp_path / "db").tuning_record):
        path.touch()
    out = tmp_path / "out"
    arguments = {"--profile": "x86-64-v2", "--from": str(tmp_path / "db")} | {
        flag: value.format(tmp=tmp_path) for flag, value in change.items()
    }
    code, stdout, stderr = run_cli(
        "starters", "build", *[x for pair in arguments.items() for x in pair], "--out", out, "-f", ROOT / "fleet.yaml"
    )
    assert (code, stdout) == (4, ""), stderr
    assert message.format(tmp=tmp_path) in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["db", "empty"]  # no `out`, no scratch left


def test_a_top_k_below_1_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["starters", "build", "--profile", "x86-64-v3", "--from", str(tmp_path), "--top-k", "0"])
    assert stopped.value.code == 2
    assert "--top-k: 0 must be at least 1" in capsys.readouterr().err
