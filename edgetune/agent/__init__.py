"""The board agent: `python -m edgetune.agent --root DIR VERB` (fetch, install, rollback,
status, run), run on each board by the operator's rollout over SSH; and `app`, the runtime
library applications on the board load their model with.

It needs only the standard library, `cryptography`, numpy and the TVM runtime: it imports the
light `edgetune.artifact` modules (manifest, codec, signing, files, verify, reference) and
nothing of the host side (inventory, fleet, tune, deploy); of TVM only `tvm.runtime` (a
runtime-only TVM build is enough). Modules, one role each:
- `config`: agent.json (`AgentConfig`, `write_config` for the rollout), token, pinned key;
- `file_tree`: the files under the root, the `current` link, the lock; `state`: state.json;
- `installation`: one installation (its config, trusted keys, server, firmware fingerprint);
- `client`: the HTTP client of `edgetune serve`; `fetch`: download and accept an artifact;
- `install`: install -> check (in a child process) -> commit, prune, rollback; `hooks`: the
  model's `on_switch` and `health` commands after a switch;
- `status`; `run` and `runtime`: load, run and time a release (the only TVM users, with `app`);
  `run_report`: the records of `run` and `check`, without TVM;
- `cli`: the command line; `answer`: the versioned answer each verb prints with `--json`.
"""

from edgetune.agent.config import AgentConfig, config_bytes, load_config, write_config

__all__ = ["AgentConfig", "config_bytes", "load_config", "write_config"]
