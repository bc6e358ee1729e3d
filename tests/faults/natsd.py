"""nats-server processes the fault suite owns: one node that can be SIGKILLed and brought back on the same port
and store, have JetStream switched off and on by config reload, or be one of a three-node cluster."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from vidjobs.cli.embedded import end_process, free_port, nats_binary

READY_LINE = "Server is ready"
START_TIMEOUT_S = 20.0


class NatsNode:
    """One nats-server with a fixed port and store directory, so a restart is the same server coming back."""

    def __init__(self, home: Path, *, name: str = "n0", routes: list[int] | None = None,
                 cluster_port: int | None = None, advertise: bool = True):
        self.home = home
        self.advertise = advertise
        self.name = name
        self.port = free_port()
        self.cluster_port = cluster_port
        self.routes = routes or []
        self.proc: subprocess.Popen | None = None
        self.log_path = home / "nats.log"

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def config(self, *, jetstream: bool = True) -> str:
        lines = [f'server_name: "{self.name}"', f'listen: "127.0.0.1:{self.port}"']
        # Reloading with `enabled: false` shuts JetStream down inside the running server: clients stay
        # connected and every JetStream request (publish, fetch, ack, info) meets "no responders". The rest
        # of the block must stay as it was: the server refuses to reload a changed sync_interval.
        lines.append(f'jetstream {{\n  enabled: {str(jetstream).lower()}\n  store_dir: "{self.home / "js"}"\n'
                     f"  sync_interval: always\n}}")
        if self.cluster_port:
            routes = ", ".join(f'"nats-route://127.0.0.1:{p}"' for p in self.routes)
            # Not advertising keeps a client to the URLs it was given (proxies, in the nemesis): otherwise the
            # server tells it every node's own client URL, and a reconnect may go round the proxy.
            lines.append(f'cluster {{\n  name: "faults"\n  listen: "127.0.0.1:{self.cluster_port}"\n'
                         f"  routes: [{routes}]\n  no_advertise: {str(not self.advertise).lower()}\n}}")
        return "\n".join(lines) + "\n"

    def start(self, *, wait: bool = True) -> NatsNode:
        self.home.mkdir(parents=True, exist_ok=True)
        self.log_path.touch()
        (self.home / "nats.conf").write_text(self.config())
        seen = self.log_path.read_text().count(READY_LINE)
        self.proc = subprocess.Popen(
            [nats_binary(), "-c", str(self.home / "nats.conf"), "-l", str(self.log_path)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
        )
        if wait:
            self.wait_ready(seen)
        return self

    def wait_ready(self, seen: int = 0) -> None:
        """Ready once the log shows one more ready line than before this start (the log is appended to)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.log_path.read_text().count(READY_LINE) <= seen:
            if self.proc is None or self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()  # never leave a half-started server behind
                raise RuntimeError(f"nats-server {self.name} did not start: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.05)

    @property
    def pid(self) -> int:
        assert self.proc is not None, "start() first"
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL: no goodbye to clients or cluster peers, nothing flushed beyond what was synced."""
        end_process(self.proc, kill=True)
        self.proc = None

    def stop(self) -> None:
        end_process(self.proc)
        self.proc = None

    def set_jetstream(self, enabled: bool) -> None:
        """Rewrite the config and SIGHUP: the server reloads it without dropping a connection. Returns once
        the log says the reload took effect; raises if the server refused it."""
        assert self.proc is not None, "start() first"
        before = self.log_path.read_text()
        (self.home / "nats.conf").write_text(self.config(jetstream=enabled))
        self.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            new = self.log_path.read_text()[len(before):]
            if "Failed to reload" in new:
                raise RuntimeError(f"nats-server refused the reload: {new[-1000:]}")
            if "Reloaded server configuration" in new:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"nats-server did not reload within {START_TIMEOUT_S}s")
            time.sleep(0.05)


class NatsCluster:
    """Three JetStream nodes on loopback, fully routed, each with its own store and client port."""

    def __init__(self, home: Path, size: int = 3, *, advertise: bool = True):
        cluster_ports = [free_port() for _ in range(size)]
        self.nodes = [
            NatsNode(home / f"n{i}", name=f"n{i}", cluster_port=cluster_ports[i],
                     routes=[p for j, p in enumerate(cluster_ports) if j != i], advertise=advertise)
            for i in range(size)
        ]

    def start(self) -> NatsCluster:
        try:
            for node in self.nodes:
                node.start(wait=False)
            for node in self.nodes:
                node.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def node(self, name: str) -> NatsNode:
        return next(n for n in self.nodes if n.name == name)

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]
