"""A network namespace of the test's own, joined to this one by a veth pair: a process
started in it reaches the host's services only through the pair, so a test can cut it
off (the link down) and heal it. Needs root (``ip netns``); ``tc netem`` is not
available here, a link down is.

    with Namespace() as ns:              # removed on exit, whatever happened
        ns.host, ns.peer                 # the host's and the namespace's addresses
        ns.prefix()                      # ["ip", "netns", "exec", name]: run a command in it
        ns.cut(); ns.heal()
"""

from __future__ import annotations

import os
import random
import subprocess
from typing import Any


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


class Namespace:
    """``ip netns add`` with a veth pair: ``host`` (this namespace's end) and ``peer``
    (the namespace's), a /30 of 10.x.y.0 of its own."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 10000:04d}{random.randrange(16**4):04x}"
        self.name = f"aaa-test-{tag}"
        self.veth_host, self.veth_peer = f"vh{tag}", f"vp{tag}"
        # a /30 no other interface of this machine uses
        used = _ip("-4", "-o", "addr").stdout
        while True:
            net = f"10.{random.randrange(200, 250)}.{random.randrange(256)}"
            base = 4 * random.randrange(64)
            if f"{net}.{base + 1}/" not in used:
                break
        self.host, self.peer = f"{net}.{base + 1}", f"{net}.{base + 2}"
        self.made = False

    def __enter__(self) -> "Namespace":
        try:
            _ip("netns", "add", self.name)
            self.made = True
            _ip("link", "add", self.veth_host, "type", "veth", "peer", "name", self.veth_peer)
            _ip("link", "set", self.veth_peer, "netns", self.name)
            _ip("addr", "add", f"{self.host}/30", "dev", self.veth_host)
            _ip("link", "set", self.veth_host, "up")
            for args in (
                ("addr", "add", f"{self.peer}/30", "dev", self.veth_peer),
                ("link", "set", "lo", "up"),
                ("link", "set", self.veth_peer, "up"),
            ):
                _ip("netns", "exec", self.name, "ip", *args)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def prefix(self) -> list[str]:
        """What starts a command inside the namespace."""
        return ["ip", "netns", "exec", self.name]

    def cut(self) -> None:
        """The link down: nothing goes through until :meth:`heal`."""
        _ip("link", "set", self.veth_host, "down")

    def heal(self) -> None:
        _ip("link", "set", self.veth_host, "up")

    def close(self) -> None:
        """Remove the pair and the namespace (each step whatever the others did)."""
        _ip("link", "del", self.veth_host, check=False)
        if self.made:
            _ip("netns", "del", self.name, check=False)
            self.made = False

    @staticmethod
    def leftovers() -> list[str]:
        """The test namespaces that exist now (none once every test has cleaned up)."""
        return [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.startswith("aaa-test-")]
