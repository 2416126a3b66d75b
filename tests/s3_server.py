"""A moto S3 server on 127.0.0.1 that a test can stop and start again: the outage drills share it."""
from __future__ import annotations


class RestartableS3:
    """A moto S3 server that a test can stop and start again on the same port; moto keeps its buckets in
    process memory, so what was stored survives a restart (like a real endpoint after an outage)."""

    def __init__(self, moto_server) -> None:
        self._moto_server = moto_server
        self._server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        self.host, self.port = self._server.get_host_and_port()
        self.endpoint = f"http://{self.host}:{self.port}"
        self.running = True

    def stop(self) -> None:
        if self.running:
            self._server.stop()
            self.running = False

    def start(self) -> None:
        if not self.running:
            self._server = self._moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
            self._server.start()
            self.running = True
