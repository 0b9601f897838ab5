"""The real artifact server (`edgetune serve`'s app on uvicorn) in a thread, for the tests: over
HTTPS with the fleet CA's certificate (made as `keys init --if-missing` would), unless the fleet
says `deploy.tls: false`."""

from __future__ import annotations

import threading
import time


class RunningServer:
    """uvicorn serving `create_app(fleet, dashboard)` in a thread, on the fleet's deploy port; `context`:
    the host's TLS context for it (only the fleet CA trusted; None over plain HTTP)."""

    def __init__(self, fleet, dashboard=None):
        import uvicorn

        from edgetune.deploy.server import create_app
        from edgetune.deploy.tls import check_server_tls, ensure_tls, host_client_context

        ensure_tls(fleet)
        self.url = fleet.deploy.url
        self.context = host_client_context(fleet)
        config = uvicorn.Config(create_app(fleet, dashboard), host=fleet.deploy.bind_host, port=fleet.deploy.port,
                                access_log=False, log_level="warning", timeout_graceful_shutdown=1,
                                **check_server_tls(fleet))  # fmt: skip
        self.server = uvicorn.Server(config)
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
