"""Added network latency for benchmarks: a network namespace joined by a veth pair (with
``tc netem`` delay when the kernel has it), and a user-space relay that delays traffic
when it does not.

:class:`NetworkNamespace` needs root and iproute2 (``ip``, ``tc``); it removes everything
it created on exit. :class:`LatencyRelay` is a TCP relay in a subprocess that holds every
chunk of data for ``delay / 2`` in each direction and every new connection for
``delay``, so a request on a new connection costs two round trips of ``delay`` as with
netem; with ``rate_mibps`` it also caps each direction's bandwidth, shared by every
connection (netem's ``rate`` does the same in the namespace).

Example::

    with NetworkNamespace("ckptbench", delay_ms=20) as ns:
        server = MotoServer(host=ns.inner_address, port=9000, command_prefix=ns.exec_prefix)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time

from ckptstore.testing.servers import LOOPBACK, ServerProcess, Service, free_port

__all__ = ["LatencyRelay", "NetworkNamespace", "netem_available"]

_CHUNK = 256 << 10


def _ip(*arguments: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", *arguments], capture_output=True, text=True, check=check, timeout=30
    )


def netem_available() -> bool:
    """Whether ``tc qdisc ... netem`` works here (the kernel may lack ``sch_netem``)."""
    if shutil.which("tc") is None or shutil.which("ip") is None:
        return False
    name = f"ckptprobe{os.getpid()}"
    try:
        _ip("netns", "add", name)
    except (subprocess.CalledProcessError, OSError):
        return False
    try:
        probe = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                name,
                "tc",
                "qdisc",
                "add",
                "dev",
                "lo",
                "root",
                "netem",
                "delay",
                "1ms",
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        return probe.returncode == 0
    finally:
        _ip("netns", "del", name, check=False)


class NetworkNamespace(Service):
    """A network namespace reachable from this one over a veth pair.

    ``inner_address`` is the namespace's end, ``outer_address`` this one's (in
    ``subnet``/24, by default one derived from the process id). With
    ``delay_ms`` and a kernel that has netem, packets leaving the namespace are delayed
    by that much (``netem`` is then true).

    Example::

        with NetworkNamespace("bench", delay_ms=20) as ns:
            subprocess.run([*ns.exec_prefix, "ip", "addr"])
    """

    def __init__(
        self,
        name: str,
        *,
        delay_ms: float = 0.0,
        subnet: str | None = None,
        rate_mibps: float = 0.0,
    ) -> None:
        self.name = f"{name}{os.getpid()}"
        self.rate_mibps = rate_mibps
        if subnet is None:  # one per process, so that two runs never share a route
            subnet = f"10.{200 + os.getpid() % 50}.{(os.getpid() // 50) % 250}"
        self.delay_ms = delay_ms
        self.outer_address = f"{subnet}.1"
        self.inner_address = f"{subnet}.2"
        self._outer = f"ckv{os.getpid() % 100000}a"
        self._inner = f"ckv{os.getpid() % 100000}b"
        self.netem = False
        self._created = False

    @property
    def exec_prefix(self) -> list[str]:
        """Prefix a command with this to run it inside the namespace."""
        return ["ip", "netns", "exec", self.name]

    def start(self) -> None:
        """Create the namespace, the veth pair and (if possible) the netem delay."""
        _ip("netns", "add", self.name)
        self._created = True
        _ip("link", "add", self._outer, "type", "veth", "peer", "name", self._inner)
        _ip("link", "set", self._inner, "netns", self.name)
        _ip("addr", "add", f"{self.outer_address}/24", "dev", self._outer)
        _ip("link", "set", self._outer, "up")
        inside = ("netns", "exec", self.name, "ip")
        _ip(*inside, "addr", "add", f"{self.inner_address}/24", "dev", self._inner)
        _ip(*inside, "link", "set", self._inner, "up")
        _ip(*inside, "link", "set", "lo", "up")
        if self.delay_ms:
            result = subprocess.run(
                [
                    *self.exec_prefix,
                    "tc",
                    "qdisc",
                    "add",
                    "dev",
                    self._inner,
                    "root",
                    "netem",
                    "delay",
                    f"{self.delay_ms}ms",
                    *(
                        ["rate", f"{self.rate_mibps * 8 * 1.048576:.0f}mbit"]
                        if self.rate_mibps
                        else []
                    ),
                ],
                capture_output=True,
                text=True,
                check=False,
                timeout=30,
            )
            self.netem = result.returncode == 0

    def stop(self) -> None:
        """Delete the veth pair and the namespace (also after a partial start)."""
        _ip("link", "del", self._outer, check=False)
        if self._created:
            _ip("netns", "del", self.name, check=False)
            self._created = False


class LatencyRelay(ServerProcess):
    """A TCP relay on 127.0.0.1 to ``upstream_host:upstream_port`` adding ``delay_ms`` of
    round-trip time, in a subprocess.

    Example::

        with LatencyRelay("10.213.47.2", 9000, delay_ms=20) as relay:
            print(relay.endpoint_url)
    """

    kind = "latency relay"

    def __init__(
        self, upstream_host: str, upstream_port: int, *, delay_ms: float, rate_mibps: float = 0.0
    ) -> None:
        super().__init__(port=free_port(), startup_timeout=30.0)
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.delay_ms = delay_ms
        self.rate_mibps = rate_mibps

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "benchmarks.network",
            "relay",
            str(self.port),
            self.upstream_host,
            str(self.upstream_port),
            str(self.delay_ms),
            str(self.rate_mibps),
        ]

    def answers(self) -> bool:
        """Whether the relay accepts a connection now (without reaching upstream)."""
        with contextlib.suppress(OSError), socket.create_connection((self.host, self.port or 0), 1):
            return True
        return False


class _Pacer:
    """One direction's bandwidth cap: chunks leave at most ``rate`` bytes per second,
    in the order they ask (0: no cap)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.free_at = 0.0

    async def take(self, nbytes: int) -> None:
        if not self.rate:
            return
        now = time.monotonic()
        start = max(now, self.free_at)
        self.free_at = start + nbytes / self.rate
        if self.free_at > now:
            await asyncio.sleep(self.free_at - now)


async def _pump(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    delay: float,
    pacer: _Pacer | None = None,
) -> None:
    """Copy ``reader`` to ``writer``, each chunk ``delay`` seconds after it arrived (and
    after ``pacer`` let it through)."""
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(maxsize=64)

    async def receive() -> None:
        data = b"-"
        while data:
            try:
                data = await reader.read(_CHUNK)
            except (OSError, ConnectionError):
                data = b""
            await queue.put((time.monotonic() + delay, data))

    async def send() -> None:
        while True:
            due, data = await queue.get()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                with contextlib.suppress(OSError, RuntimeError):
                    writer.write_eof()
                return
            if pacer is not None:
                await pacer.take(len(data))
            writer.write(data)
            await writer.drain()

    receiving = asyncio.ensure_future(receive())
    try:
        await send()
    except (OSError, ConnectionError):
        return
    finally:
        receiving.cancel()
        with contextlib.suppress(asyncio.CancelledError, OSError, ConnectionError):
            await receiving


async def _relay(
    port: int, host: str, upstream_port: int, delay_ms: float, rate_mibps: float = 0.0
) -> None:
    one_way = delay_ms / 2000
    upload, download = _Pacer(rate_mibps * (1 << 20)), _Pacer(rate_mibps * (1 << 20))

    async def handle(
        client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        writers = [client_writer]
        try:
            await asyncio.sleep(delay_ms / 1000)  # the connection's own round trip
            server_reader, server_writer = await asyncio.open_connection(host, upstream_port)
            writers.append(server_writer)
            await asyncio.gather(
                _pump(client_reader, server_writer, one_way, upload),
                _pump(server_reader, client_writer, one_way, download),
            )
        except Exception as error:  # one broken connection must not stop the relay
            print(f"latency relay: connection dropped ({error!r})", file=sys.stderr)
        finally:
            for writer in writers:
                writer.close()

    running: set[asyncio.Task[None]] = set()

    def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # keep a strong reference: asyncio holds tasks weakly, and a connection's task
        # collected while it waits would drop the connection
        task = asyncio.ensure_future(handle(reader, writer))
        running.add(task)
        task.add_done_callback(running.discard)

    server = await asyncio.start_server(accept, LOOPBACK, port, backlog=1024)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="TCP relay that adds latency")
    commands = parser.add_subparsers(dest="command", required=True)
    relay = commands.add_parser("relay")
    relay.add_argument("port", type=int)
    relay.add_argument("host")
    relay.add_argument("upstream_port", type=int)
    relay.add_argument("delay_ms", type=float)
    relay.add_argument("rate_mibps", type=float, nargs="?", default=0.0)
    args = parser.parse_args(argv)
    asyncio.run(_relay(args.port, args.host, args.upstream_port, args.delay_ms, args.rate_mibps))


if __name__ == "__main__":
    main()
