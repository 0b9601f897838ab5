"""The real artifact server (`edgetune serve`'s `build_server`) in a thread, for the tests: over
HTTPS with the fleet CA's certificate (made as `keys init --if-missing` would), unless the fleet
says `deploy.tls: false`."""

from __future__ import annotations

import threading
import time


class RunningServer:
    """`build_server(fleet, dashboard=dashboard)` in a thread, on the fleet's deploy port; `context`:
    the host's TLS context for it (only the fleet CA trusted; None over plain HTTP)."""

    def __init__(self, fleet, dashboard=None):
        from edgetune.deploy.keys import ensure_decision_key
        from edgetune.deploy.server import build_server
        from edgetune.deploy.tls import ensure_tls, host_client_context

        ensure_decision_key(fleet)
        ensure_tls(fleet)
        self.url = fleet.deploy.url
        self.context = host_client_context(fleet)
        self.server = build_server(fleet, dashboard=dashboard)
        self.server.config.timeout_graceful_shutdown = 1
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise TimeoutError("the artifact server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
