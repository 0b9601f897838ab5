"""The artifact format core, shared by the host and the board agent: what an artifact is and
how it is checked. It needs only the standard library, numpy and `cryptography` (no TVM, no
host package), so it travels inside the agent's bundle to boards that have nothing of edgetune.

Modules, one role each:
- `manifest`: the manifest schema (dataclasses, canonical JSON, inputs digest);
- `codec`: canonical and strict JSON into typed records; `timing_stats`: latency summaries;
- `signing`: ed25519 keys and signatures (`manifest.sig`, `index.sig`); `trust`: the keys by
  role, their rotations and revocations, and the board's check of them;
- `files`: tree walks, tarballs and safe unpacking; `places`: where versions sit in a store;
- `verify`: check a version directory or tarball against its manifest, its signature and what
  the caller expects it to be; `reference`: reference inputs and outputs, and their check.
"""
