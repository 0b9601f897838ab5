"""Delivering artifacts to boards, on top of `artifact/`.

- `offer`: which version a board should run (newest, or pinned for its class or for it), of
  those the store's signed index lists;
- `tokens`: the per-board download tokens (secrets in files or environment variables);
- `keys`: the keys by role (the decision key, the trust file certifying it), rotation, revocation;
- `decisions`: the signed, expiring, numbered answer a board acts on (serials kept on the host);
- `tls`: the fleet CA and the server certificate (`keys init`), the host's pinned client context;
- `server`: `edgetune serve`, the HTTPS artifact server boards download from (Starlette/uvicorn);
  `connections`: its per-connection guard (limits, timeouts); `log_limit`: its bounded warnings;
- `pull`: `edgetune pull`, what one board would get, downloaded and verified for the operator;
- `remote`: the board agent (`python -m edgetune.agent`) provisioned and driven over SSH;
- `rollout`: `edgetune rollout`, a version rolled over the fleet in canary + batches;
  `rollout_journal`: its intent journal, what a killed rollout leaves for the next one.
The board side is `edgetune.agent`, which needs none of this package.
"""
