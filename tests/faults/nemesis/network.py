"""The network between the services and their servers: a TCP fault proxy (tests/faults/proxy.py, each on a
thread of its own, so the load's event loop never delays what it pipes) in front of every address the services
are given for PostgreSQL and NATS. The harness itself, and the nodes of the NATS cluster among themselves, reach
the servers directly: a partition here is one between the services and a server.

A partition ends as it does on a real network after long enough: the connections that lived through it are
reset (a kernel's keepalive or a client's timeout would end them; the proxy's black hole drops what was sent
into it, and a connection piping again past that gap would be one no real network makes), and new ones work."""

from __future__ import annotations

import contextlib
from urllib.parse import urlsplit

from tests.faults.proxy import FaultProxy, ProxyThread


class Network:
    def __init__(self) -> None:
        self.proxies: dict[int, ProxyThread] = {}  # by the port of the server it stands in front of

    def via(self, url: str) -> str:
        """`url` (one server, several comma-separated URLs, or one URL naming several `host:port`s, as a
        multi-host PostgreSQL URL does) with every server address replaced by its proxy's."""
        if "," in url and url.count("://") > 1:
            return ",".join(self.via(part) for part in url.split(","))
        parts = urlsplit(url)
        userinfo, at, hosts = parts.netloc.rpartition("@")
        proxied = ",".join(self._proxied(address) for address in hosts.split(","))
        return parts._replace(netloc=f"{userinfo}{at}{proxied}").geturl()

    def _proxied(self, address: str) -> str:
        host, _, port = address.rpartition(":")
        server_port = int(port)
        if server_port not in self.proxies:
            self.proxies[server_port] = ProxyThread(host, server_port).__enter__()
        proxy = self.proxies[server_port].proxy
        assert proxy is not None
        return f"127.0.0.1:{proxy.port}"

    def of(self, url_or_port: str | int) -> ProxyThread:
        """The proxy in front of a server, by its URL or port."""
        port = url_or_port if isinstance(url_or_port, int) else urlsplit(url_or_port).port
        assert port is not None
        return self.proxies[port]

    def close(self) -> None:
        for proxied in self.proxies.values():
            with contextlib.suppress(Exception):
                proxied.__exit__(None, None, None)
        self.proxies.clear()


def partition(proxies: list[ProxyThread]) -> None:
    for proxied in proxies:
        proxied.call(FaultProxy.black_hole)


def mend(proxies: list[ProxyThread], *, reset: bool) -> None:
    """End a fault: with `reset` (a partition) live connections are reset first; new ones are piped cleanly."""
    for proxied in proxies:
        if reset:
            proxied.call(FaultProxy.reset)
        proxied.call(FaultProxy.heal)


def slow(proxies: list[ProxyThread], seconds: float) -> None:
    for proxied in proxies:
        proxied.call(FaultProxy.latency, seconds, seconds / 2)
