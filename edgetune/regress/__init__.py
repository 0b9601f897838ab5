"""Regression checks after firmware updates (`edgetune regress`), on top of `deploy/`.

- `check`: per board and model, run the deployed artifact on the board through its agent,
  check its output against the signed expected output and compare its latency with the
  baseline the artifact's manifest holds (noise-aware: `artifact.timing_stats`), and say
  whether the board's firmware changed since that baseline;
- `retune`: for classes found slower, re-tune (resuming the class database, now measured on
  the new firmware) and rebuild; report old and new latency side by side. Never rolls out.
"""
