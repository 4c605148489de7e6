"""Worker "hosts" for tests of several machines: a network namespace each, reached through a bridge.

Each host is a Linux network namespace with its own loopback and a veth link to this machine,
and its own hostname (a UTS namespace), so a process there sees only the services this test
forwards to it: PostgreSQL, Redis and the S3 store, at this side's address of the link. Without
the privileges for namespaces (not root, no ``ip``), a host is a plain process with its own
working directory and data folder: the same separation of files, without the network's.
"""

from __future__ import annotations

import itertools
import os
import selectors
import shutil
import socket
import subprocess
import threading
from pathlib import Path

_SUBNETS = itertools.count(1)


def namespaces_available() -> bool:
    """Whether this process may create network namespaces (root with iproute2)."""
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("unshare"):
        return False
    name = f"rsi-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, check=False).returncode == 0
    if made:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
    return made


class Forwarder:
    """Relay TCP connections from ``listen`` to ``target`` (threads; for a test's few connections)."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self.target = target
        self.server = socket.create_server(listen, reuse_port=False)
        self._stopping = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stopping:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        with selectors.DefaultSelector() as selector, a, b:
            selector.register(a, selectors.EVENT_READ, b)
            selector.register(b, selectors.EVENT_READ, a)
            while True:
                for key, _ in selector.select():
                    try:
                        data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                    except OSError:
                        return
                    if not data:
                        return
                    key.data.sendall(data)

    def close(self) -> None:
        self._stopping = True
        self.server.close()


class Host:
    """One worker host. ``command(argv)`` is how to run a program there; ``address`` is where it
    reaches this machine's forwarded services (``127.0.0.1`` when namespaces are unavailable)."""

    def __init__(self, name: str, root: Path, *, isolated: bool) -> None:
        self.name = name
        self.root = root
        self.root.mkdir(parents=True)
        self.isolated = isolated
        self.forwarders: list[Forwarder] = []
        if not isolated:
            self.address = "127.0.0.1"
            return
        subnet = next(_SUBNETS)
        self.netns = f"rsi-{os.getpid()}-{name}"[:15]
        self.link = f"rsi{os.getpid() % 100000}{name[-1]}"[:15]
        self.address = f"10.{200 + os.getpid() % 50}.{subnet}.1"
        self.own_address = f"10.{200 + os.getpid() % 50}.{subnet}.2"
        for argv in (
            ["ip", "netns", "add", self.netns],
            ["ip", "link", "add", self.link, "type", "veth", "peer", "name", f"{self.link}n"],
            ["ip", "link", "set", f"{self.link}n", "netns", self.netns],
            ["ip", "addr", "add", f"{self.address}/24", "dev", self.link],
            ["ip", "link", "set", self.link, "up"],
            ["ip", "netns", "exec", self.netns, "ip", "addr", "add", f"{self.own_address}/24", "dev", f"{self.link}n"],
            ["ip", "netns", "exec", self.netns, "ip", "link", "set", f"{self.link}n", "up"],
            ["ip", "netns", "exec", self.netns, "ip", "link", "set", "lo", "up"],
        ):
            subprocess.run(argv, check=True, capture_output=True)

    def forward(self, port: int) -> int:
        """Make this machine's ``127.0.0.1:port`` reachable from the host at ``address:port``."""
        if self.isolated:
            self.forwarders.append(Forwarder((self.address, port), ("127.0.0.1", port)))
        return port

    def command(self, argv: list[str]) -> list[str]:
        if not self.isolated:
            return argv
        # Its own network and hostname; `exec` keeps one process, so its pid leads the group.
        script = f'hostname {self.name} && exec "$@"'
        return ["ip", "netns", "exec", self.netns, "unshare", "--uts", "sh", "-c", script, "sh", *argv]

    def close(self) -> None:
        for forwarder in self.forwarders:
            forwarder.close()
        if self.isolated:
            subprocess.run(["ip", "link", "del", self.link], capture_output=True, check=False)
            subprocess.run(["ip", "netns", "del", self.netns], capture_output=True, check=False)
