"""Tuning on a Ray cluster (`compute: {ray: ...}` in fleet.yaml; docs/compute.md): the one place
edgetune imports Ray.

- `cluster`: connecting (an unreachable cluster is refused before anything starts), checking
  that every node reaches the tracker and sees the workdir, and running each device class's
  tuning run as a Ray task (stopped on request, or cancelled);
- `builder`: `RayBuilder`, MetaSchedule's builder whose candidate builds are Ray tasks.

Every node needs the host's Python packages (`pip install 'edgetune[host,ray]'`, the same
versions): the tasks run edgetune's own code there.
"""

from __future__ import annotations

from edgetune.errors import TuneError

try:
    import ray  # noqa: F401
except ImportError as err:  # the `ray` extra is optional: `compute: local` needs none of it
    raise TuneError(
        "compute: ray needs Ray on this host: pip install 'edgetune[host,ray]' (the same Ray version "
        "as the cluster's nodes), or set `compute: local` in fleet.yaml"
    ) from err
