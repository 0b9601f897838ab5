"""`edgetune report`: the fleet dashboard, one static HTML page drawn from what is on disk (the
fleet state and journal, the tuning reports, the artifact store; see docs/dashboard.md).

- `sources`: reads the files, keeping each damaged one as a problem named in the page;
- `views`: what each part of the page says (boards, artifact versions, tuning, history);
- `plots`: the charts, as PNG data URIs;
- `page`: the HTML, self-contained (nothing is fetched when it opens).

`report(fleet, out_dir)` writes `dashboard.html`; `DashboardCache` gives `edgetune serve` the page,
drawn again only when one of its input files changed.
"""

from __future__ import annotations

import threading
from datetime import datetime, timezone
from pathlib import Path

from edgetune.durable import write_atomic
from edgetune.inventory.schema import Fleet
from edgetune.report.page import render_page
from edgetune.report.sources import input_files, read_sources

PAGE_NAME = "dashboard.html"


def render(fleet: Fleet) -> bytes:
    """The dashboard's HTML, from the files as they are now."""
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return render_page(read_sources(fleet), generated)


def report(fleet: Fleet, out_dir: Path) -> Path:
    """Write the dashboard to `out_dir/dashboard.html` (atomically); return its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / PAGE_NAME
    write_atomic(path, render(fleet))
    return path


class DashboardCache:
    """The page for the server: drawn on the first request, and again on a request after any
    input file appeared, disappeared or changed (size or mtime)."""

    def __init__(self, fleet: Fleet):
        self._fleet = fleet
        self._lock = threading.Lock()
        self._drawn: tuple[tuple, bytes] | None = None

    def __call__(self) -> bytes:
        with self._lock:
            key = self._inputs_key()
            if self._drawn is None or self._drawn[0] != key:
                self._drawn = (key, render(self._fleet))
            return self._drawn[1]

    def _inputs_key(self) -> tuple:
        key = []
        for path in sorted(input_files(self._fleet)):
            try:
                st = path.stat()
            except OSError:
                continue
            key.append((str(path), st.st_mtime_ns, st.st_size))
        return tuple(key)
