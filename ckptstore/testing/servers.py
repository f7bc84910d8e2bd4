"""Local object-store servers in subprocesses: moto (S3) and gcp-storage-emulator (GCS).

Each server listens on ``127.0.0.1`` on a free port (or the one given), and
:meth:`ServerProcess.start` returns only once it answers HTTP. A server can be stopped
and started again on the same port (the GCS emulator keeps its objects across restarts
when given a ``data_dir``; moto keeps nothing). ``command_prefix`` runs the server
under another command, such as ``["ip", "netns", "exec", "ns"]``.

Example::

    >>> from ckptstore_s3 import S3Path
    >>> with MotoServer() as server:  # any credentials work
    ...     server.create_bucket("demo")
    ...     storage = S3Path("s3://demo/run", endpoint_url=server.endpoint_url,
    ...                      key="testing", secret="testing")
    ...     storage.write_bytes("trainer_0.1/a", b"hello")
    ...     print(server.endpoint_url)
    ...     print(server.object_keys("demo"))
    http://127.0.0.1:...
    ['run/trainer_0.1/a']
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import xml.etree.ElementTree as ElementTree
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import IO, ClassVar, Self

from ckptstore._closing import Closing

__all__ = ["GcsEmulator", "MotoServer", "ServerProcess", "Service", "free_port", "wait_for"]

LOOPBACK = "127.0.0.1"
_FAKE_SIGV4 = {
    "Authorization": "AWS4-HMAC-SHA256 Credential=testing/20240101/us-east-1/s3/aws4_request, "
    "SignedHeaders=host, Signature=0",
    "x-amz-content-sha256": "UNSIGNED-PAYLOAD",
    "x-amz-date": "20240101T000000Z",
}


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


def wait_for(
    condition: Callable[[], object], *, timeout: float, interval: float = 0.02, what: str
) -> None:
    """Poll ``condition()`` until it is true; :class:`TimeoutError` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


class Service(Closing):
    """Something a test starts and stops. ``with service:`` starts it (closing it again
    if starting fails half-way) and closes it when the block ends.

    Example::

        >>> class Counter(Service):
        ...     running = False
        ...     def start(self):
        ...         self.running = True
        ...     def stop(self):
        ...         self.running = False
        >>> with Counter() as service:
        ...     print(service.running)
        True
        >>> service.running
        False
    """

    @abstractmethod
    def start(self) -> object:
        """Start the service (a no-op when it runs already)."""

    @abstractmethod
    def stop(self) -> None:
        """Stop the service; it may be started again."""

    def close(self) -> None:
        """Stop for good, releasing what outlives a restart (by default: :meth:`stop`)."""
        self.stop()

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self


class ServerProcess(Service):
    """A local HTTP server in a subprocess, started and stopped by the test itself.

    Example::

        >>> class StaticFiles(ServerProcess):  # a server is its command line
        ...     kind = "static files"
        ...     def command(self):
        ...         return [sys.executable, "-m", "http.server", "-b", self.host, str(self.port)]
        >>> server = StaticFiles()
        >>> server.start()  # picks a free port, waits until it answers
        >>> server.running, server.request("GET", "/")[0]
        (True, 200)
        >>> server.stop()
        >>> server.running
        False
    """

    kind: ClassVar[str]
    probe_path: ClassVar[str] = "/"

    def __init__(
        self,
        *,
        host: str = LOOPBACK,
        port: int | None = None,
        startup_timeout: float = 60.0,
        command_prefix: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.startup_timeout = startup_timeout
        self.command_prefix = list(command_prefix)
        self.env = dict(env or {})
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def endpoint_url(self) -> str:
        """``http://host:port`` of the running server."""
        if self.port is None:
            raise RuntimeError(f"the {self.kind} server has not been started")
        return f"http://{self.host}:{self.port}"

    @abstractmethod
    def command(self) -> list[str]:
        """The command line that runs the server on ``self.host:self.port``."""

    def start(self) -> None:
        """Start the server and wait until it answers; raises with its log if it dies."""
        if self.running:
            return
        if self.port is None:
            if self.host != LOOPBACK:
                raise ValueError(f"give the {self.kind} server a port to listen on {self.host}")
            self.port = free_port(self.host)
        if self._log is None:  # kept open across restarts; closed by close()
            self._log = tempfile.TemporaryFile(prefix=f"ckptstore-{self.kind}-")  # noqa: SIM115
        environment = {**os.environ, **self.env}
        self.process = subprocess.Popen(
            [*self.command_prefix, *self.command()],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=environment,
            start_new_session=True,
        )
        deadline = time.monotonic() + self.startup_timeout
        while not self.answers():
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the {self.kind} server exited with code {self.process.returncode} "
                    f"while starting:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(
                    f"the {self.kind} server did not answer on {self.endpoint_url} within "
                    f"{self.startup_timeout:.0f} s:\n{self.log_tail()}"
                )
            time.sleep(0.05)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def answers(self) -> bool:
        """Whether the server answers an HTTP request now."""
        try:
            status, _ = self.request("GET", self.probe_path, timeout=2.0)
        except OSError:
            return False
        return status < 500

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 10 s)."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)

    def restart(self) -> None:
        """Stop the server and start it again on the same port."""
        self.stop()
        self.start()

    def log_tail(self, lines: int = 40) -> str:
        """The last lines the server printed."""
        if self._log is None:
            return ""
        self._log.flush()
        self._log.seek(0)
        text = self._log.read().decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:])

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float = 30.0,
    ) -> tuple[int, bytes]:
        """One plain HTTP request to the server; returns ``(status, body)``."""
        if self.port is None:
            raise RuntimeError(f"the {self.kind} server has not been started")
        connection = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            connection.request(method, path, body=body, headers=dict(headers or {}))
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def close(self) -> None:
        """Stop the server and drop its log (which :meth:`restart` keeps)."""
        self.stop()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __repr__(self) -> str:
        state = self.endpoint_url if self.port is not None else "not started"
        return f"{type(self).__name__}({state}, running={self.running})"


class MotoServer(ServerProcess):
    """moto's S3 in server mode (``python -m moto.server``). Any credentials work.

    Example::

        >>> from ckptstore_s3 import S3Path
        >>> with MotoServer() as server:
        ...     server.create_bucket("runs")
        ...     url = server.endpoint_url
        ...     storage = S3Path("s3://runs/job", endpoint_url=url, key="k", secret="s")
        ...     storage.write_bytes("a", b"x")
        ...     before = server.object_keys("runs")
        ...     server.reset()  # forget every bucket and object
        ...     print(before, server.object_keys("runs"))
        ['job/a'] []
    """

    kind = "moto S3"
    probe_path = "/moto-api/data.json"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(self.port)]

    def _s3(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        return self.request(method, path, body, _FAKE_SIGV4)

    def create_bucket(self, name: str) -> None:
        """Create bucket ``name`` (in us-east-1)."""
        status, body = self._s3("PUT", f"/{name}")
        if status != 200:
            raise RuntimeError(f"could not create bucket {name!r}: HTTP {status} {body[:200]!r}")

    def object_keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Every key in ``bucket`` under ``prefix`` (lists directly, not via any proxy)."""
        keys: list[str] = []
        token = ""
        while True:
            query = {"list-type": "2", "prefix": prefix}
            if token:
                query["continuation-token"] = token
            status, body = self._s3("GET", f"/{bucket}?{urllib.parse.urlencode(query)}")
            if status == 404:
                return keys
            if status != 200:
                raise RuntimeError(f"could not list bucket {bucket!r}: HTTP {status}")
            root = ElementTree.fromstring(body)
            namespace = root.tag.partition("}")[0] + "}" if root.tag.startswith("{") else ""
            keys.extend(node.text or "" for node in root.iter(f"{namespace}Key"))
            truncated = root.find(f"{namespace}IsTruncated")
            next_token = root.find(f"{namespace}NextContinuationToken")
            if truncated is None or truncated.text != "true" or next_token is None:
                return sorted(keys)
            token = next_token.text or ""

    def delete_bucket(self, name: str) -> None:
        """Delete bucket ``name`` and everything in it (missing buckets are ignored)."""
        for key in self.object_keys(name):
            self._s3("DELETE", f"/{name}/{urllib.parse.quote(key)}")
        self._s3("DELETE", f"/{name}")

    def reset(self) -> None:
        """Forget every bucket and object."""
        self.request("POST", "/moto-api/reset")


class GcsEmulator(ServerProcess):
    """A local Google Cloud Storage for tests: gcp-storage-emulator, in a child process.

    It serves the JSON API of Google Cloud Storage, in memory, or on disk under
    ``data_dir``. On disk, objects survive a restart, even one that stops the server
    mid-write (see :mod:`ckptstore.testing.gcs_emulator`). No credentials are needed.
    The emulator ignores ``ifGenerationMatch``; ``enforce_preconditions=True`` makes it
    refuse (412) an upload whose object is not at the generation asked for, as GCS does.

    Example::

        >>> with GcsEmulator() as server:  # in memory; data_dir=... keeps objects on disk
        ...     server.create_bucket("b")
        ...     upload = "/upload/storage/v1/b/b/o?uploadType=media&name=k"
        ...     status, _ = server.request("POST", upload, b"x")
        ...     print(status, server.object_keys("b"))
        200 ['k']
        >>> with GcsEmulator(enforce_preconditions=True) as server:
        ...     server.create_bucket("b")
        ...     create = "/upload/storage/v1/b/b/o?uploadType=media&name=k&ifGenerationMatch=0"
        ...     first, second = (server.request("POST", create, body)[0] for body in (b"x", b"y"))
        ...     print(first, second)
        200 412
    """

    kind = "GCS emulator"
    probe_path = "/"

    def __init__(
        self,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        enforce_preconditions: bool = False,
        **kwargs: object,
    ) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        # the emulator refuses relative directories: resolve against this process's cwd
        self.data_dir = os.path.abspath(data_dir) if data_dir is not None else None
        self.enforce_preconditions = enforce_preconditions

    def command(self) -> list[str]:
        storage = ["-d", self.data_dir] if self.data_dir is not None else []
        memory = [] if self.data_dir is not None else ["--in-memory"]
        return [
            sys.executable,
            "-m",
            "ckptstore.testing.gcs_emulator",  # the emulator, with files written whole
            *(["--enforce-preconditions"] if self.enforce_preconditions else []),
            *storage,
            "start",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--quiet",
            *memory,
        ]

    def create_bucket(self, name: str, project: str = "test-project") -> None:
        """Create bucket ``name``."""
        status, body = self.request(
            "POST",
            f"/storage/v1/b?project={project}",
            json.dumps({"name": name}).encode(),
            {"Content-Type": "application/json"},
        )
        if status != 200:
            raise RuntimeError(f"could not create bucket {name!r}: HTTP {status} {body[:200]!r}")

    def object_keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Every object name in ``bucket`` under ``prefix`` (lists directly)."""
        names: list[str] = []
        token = ""
        while True:
            query = {"prefix": prefix}
            if token:
                query["pageToken"] = token
            status, body = self.request(
                "GET", f"/storage/v1/b/{bucket}/o?{urllib.parse.urlencode(query)}"
            )
            if status == 404:
                return names
            if status != 200:
                raise RuntimeError(f"could not list bucket {bucket!r}: HTTP {status}")
            document = json.loads(body or b"{}")
            names.extend(item["name"] for item in document.get("items", []))
            token = document.get("nextPageToken") or ""
            if not token:
                return sorted(names)

    def delete_bucket(self, name: str) -> None:
        """Delete bucket ``name`` and everything in it (missing buckets are ignored)."""
        for key in self.object_keys(name):
            self.request("DELETE", f"/storage/v1/b/{name}/o/{urllib.parse.quote(key, safe='')}")
        self.request("DELETE", f"/storage/v1/b/{name}")
