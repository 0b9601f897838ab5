"""An application on a board that uses a model edgetune rolls out: it runs the model in a loop on
its release's reference input, checks every answer against that release's expected output, and
follows rollouts between calls (docs/app.md). Run it with the board's Python:

    python app.py --workdir /opt/edgetune --model mlp [--seconds 60] [--once]

It needs nothing of edgetune on the board but the agent's bundle, which the rollout delivers
(`<workdir>/agent/edgetune-agent.pyz`). Each call is one JSON line on stdout:
`{"call", "time", "version", "ms", "ok", "max_abs_error"}`; a switch to another version is a
line `{"switched_to", "time"}`. `--once`: one checked call, exit status 0 if it matched (a
health check for the rollout's health gate).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True, help="the board's edgetune workdir (or its agent directory)")
    parser.add_argument("--model", required=True)
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to run (default 60)")
    parser.add_argument("--once", action="store_true", help="one checked call; exit 0 if it matched")
    args = parser.parse_args()
    agent_dir = Path(args.workdir) if (Path(args.workdir) / "agent.json").exists() else Path(args.workdir) / "agent"
    sys.path.insert(0, str(agent_dir / "edgetune-agent.pyz"))
    from edgetune.agent.app import Model

    model = Model.open(agent_dir, args.model)
    end, call = time.monotonic() + args.seconds, 0
    while True:
        if model.reload_if_changed():
            print(json.dumps({"switched_to": model.version, "time": time.time()}), flush=True)
        version, given = model.version, model.reference_input()
        started = time.perf_counter()
        outputs = model.run(**given)
        ms = (time.perf_counter() - started) * 1e3
        check = model.check(outputs)
        print(
            json.dumps(
                {
                    "call": call,
                    "time": time.time(),
                    "version": version,
                    "ms": round(ms, 3),
                    "ok": check.ok,
                    "max_abs_error": check.max_abs_error,
                }
            ),
            flush=True,
        )
        if args.once:
            return 0 if check.ok else 1
        call += 1
        if time.monotonic() >= end:
            return 0


if __name__ == "__main__":
    sys.exit(main())
