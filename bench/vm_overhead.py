"""What a call costs outside the kernels: the Relax VM's own time per kernel it launches.

A chain of N tiny element-wise kernels (adds and ReLUs on 128 floats, nothing fused, so the
kernels' own work is a few nanoseconds) is built as edgetune ships models
(`exec_mode="compiled"`) and as the bytecode VM, and called from Python the way the board
agent and bench/side_by_side.py call models (the function looked up once). Both builds are
timed in interleaved rounds (ABAB), every call with perf_counter_ns, for N and for 0 kernels
(one copy), so the difference divided by N is the cost per kernel launch.

    .venv/bin/python bench/vm_overhead.py [--kernels 100] [--rounds 20] [--calls 500]

Runs on the host, 1 thread (TVM_NUM_THREADS=1); no fleet needed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TVM_NUM_THREADS", "1")

import numpy as np  # noqa: E402

SHAPE = (1, 8, 4, 4)
MODES = ("compiled", "bytecode")


def chain(kernels: int):
    """A Relax module whose `main` launches `kernels` element-wise kernels one after another."""
    from tvm import relax
    from tvm.script import relax as R

    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor(SHAPE, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            current = bb.emit(relax.op.add(x, relax.const(np.float32(1.0))))
            for index in range(kernels - 1):
                op = relax.op.nn.relu(current) if index % 2 else relax.op.add(current, relax.const(np.float32(0.5)))
                current = bb.emit(op)
            out = bb.emit_output(current)
        bb.emit_func_output(out)
    return bb.get()


def vm_function(mod, mode: str):
    import tvm
    from tvm import relax

    target = tvm.target.Target({"kind": "llvm", "mcpu": "icelake-server"})
    executable = relax.build(relax.transform.LegalizeOps()(mod), target=target, exec_mode=mode)
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return vm, vm["main"]


def interleaved(calls: dict, rounds: int, per_round: int) -> dict[str, list[float]]:
    """{label: [median µs per round]}, the labels' order alternating every round."""
    per_label = {label: [] for label in calls}
    labels = list(calls)
    for round_no in range(rounds):
        for label in labels if round_no % 2 == 0 else labels[::-1]:
            call, samples = calls[label], []
            for _ in range(per_round):
                start = time.perf_counter_ns()
                call()
                samples.append(time.perf_counter_ns() - start)
            per_label[label].append(statistics.median(samples) / 1e3)
    return per_label


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--calls", type=int, default=500, help="calls per label per round")
    args = parser.parse_args()

    import tvm

    data = tvm.runtime.tensor(np.ones(SHAPE, np.float32))
    calls, keep = {}, []
    for mode in MODES:
        for kernels in (1, args.kernels):
            vm, function = vm_function(chain(kernels), mode)
            keep.append(vm)
            calls[(mode, kernels)] = lambda f=function: f(data)
            for _ in range(200):
                calls[(mode, kernels)]()
    rounds = interleaved(calls, args.rounds, args.calls)
    print(f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC; {os.cpu_count()} cores; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; {args.rounds} rounds x {args.calls} calls per build, "
          "interleaved; median of round medians [min-max over rounds]")
    for mode in MODES:
        one, many = rounds[(mode, 1)], rounds[(mode, args.kernels)]
        per_kernel = [(m - o) / (args.kernels - 1) for m, o in zip(many, one)]
        print(f"{mode:9s}: 1 kernel {statistics.median(one):7.2f} µs [{min(one):.2f}-{max(one):.2f}]; "
              f"{args.kernels} kernels {statistics.median(many):7.2f} µs [{min(many):.2f}-{max(many):.2f}]; "
              f"per extra kernel launch {statistics.median(per_kernel) * 1e3:6.0f} ns "
              f"[{min(per_kernel) * 1e3:.0f}-{max(per_kernel) * 1e3:.0f}]")


if __name__ == "__main__":
    main()
