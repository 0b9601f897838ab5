"""The real artifact server (`edgetune serve`'s app on uvicorn) in a thread, for the tests."""

from __future__ import annotations

import threading
import time


class RunningServer:
    """uvicorn serving `create_app(fleet)` in a thread, on the fleet's deploy port."""

    def __init__(self, fleet):
        import uvicorn

        from edgetune.deploy.server import create_app

        self.url = fleet.deploy.url
        config = uvicorn.Config(create_app(fleet), host=fleet.deploy.bind_host, port=fleet.deploy.port,
                                access_log=False, log_level="warning")  # fmt: skip
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
