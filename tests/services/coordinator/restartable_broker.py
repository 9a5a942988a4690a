"""A tansu broker that keeps its log in S3 (the SeaweedFS the tests start) and can be killed
with SIGKILL and restarted on the same port, for broker restarts mid-stream.

The session's tansu keeps its log in memory; this one is started per test with
``--storage-engine s3://<bucket>/`` so that what it acknowledged survives a kill -9.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from icefloe.dev.local_stack import HOST, S3Endpoint, free_port, probe_kafka, tansu_binary

START_TIMEOUT_S = 60.0


class RestartableBroker:
    """tansu on S3 storage at a fixed port: :meth:`kill` (SIGKILL) and :meth:`start` again."""

    def __init__(self, s3: S3Endpoint, logs: Path) -> None:
        self.bucket = s3.create_bucket()
        self.port = free_port()
        self.logs = logs
        self.env = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": s3.access_key_id,
            "AWS_SECRET_ACCESS_KEY": s3.secret_access_key,
            "AWS_DEFAULT_REGION": s3.region,
            "AWS_ENDPOINT": s3.endpoint_url,
            "AWS_ALLOW_HTTP": "true",
        }
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def start(self) -> None:
        self.starts += 1
        url = f"tcp://{HOST}:{self.port}"
        command = [
            str(tansu_binary()),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            f"s3://{self.bucket}/",
        ]
        with (self.logs / f"tansu-s3-{self.starts}.log").open("wb") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=self.env
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not probe_kafka(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"tansu on S3 did not start (exit {self.process.poll()}): see {self.logs}"
                )
            time.sleep(0.1)

    def kill(self) -> None:
        """kill -9: whatever it had not yet written to S3 is lost, as in a crash."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()
        self.process = None

    def stop(self) -> None:
        self.kill()
