"""Two "hosts" on one machine for the real-path benchmarks and tests: network namespaces
joined by a veth pair (``shared/design/real-paths.md``), with the link's MTU, loss and speed
set as a test or benchmark needs, and processes started inside either namespace.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import wait_ready

ROOT = Path(__file__).resolve().parents[1]


# -- the two "hosts" ---------------------------------------------------------------------


@dataclass
class Link:
    """Two namespaces joined by a veth pair: ``server_ns`` has ``server_ip``."""

    server_ns: str
    client_ns: str
    server_if: str
    client_if: str
    server_ip: str
    client_ip: str
    loss: float = 0.0
    rate: str | None = None

    def run(self, ns: str, *cmd: str) -> None:
        subprocess.run(["ip", "netns", "exec", ns, *cmd], check=True, capture_output=True)

    def set_mtu(self, mtu: int) -> None:
        for ns, dev in ((self.server_ns, self.server_if), (self.client_ns, self.client_if)):
            subprocess.run(["ip", "-n", ns, "link", "set", dev, "mtu", str(mtu)], check=True)

    def set_rate(self, rate: str | None) -> None:
        """Shape both ends of the pair to ``rate`` (``1gbit``, ``10gbit``, ``100mbit``: tc's
        units) with a token bucket, as a NIC of that speed would send; None: unshaped."""
        for ns, dev in ((self.server_ns, self.server_if), (self.client_ns, self.client_if)):
            shape(ns, dev, rate)
        self.rate = rate

    def set_loss(self, loss: float) -> None:
        """Drop ``loss`` of every TCP and UDP packet leaving either namespace."""
        for ns in (self.server_ns, self.client_ns):
            subprocess.run(
                ["ip", "netns", "exec", ns, "nft", "delete", "table", "inet", "aqloss"],
                capture_output=True,
            )
            if loss > 0:
                scale = 100_000
                rules = (
                    "table inet aqloss {\n chain out {\n"
                    "  type filter hook output priority 0; policy accept;\n"
                    f"  meta l4proto {{ tcp, udp }} numgen random mod {scale} "
                    f"< {round(loss * scale)} drop\n }}\n}}\n"
                )
                subprocess.run(
                    ["ip", "netns", "exec", ns, "nft", "-f", "-"],
                    input=rules,
                    text=True,
                    check=True,
                )
        self.loss = loss


def shape(ns: str, dev: str, rate: str | None) -> None:
    """Shape what ``dev`` (in namespace ``ns``) sends to ``rate`` with a token bucket, as a
    NIC of that speed would send; None: unshaped."""
    subprocess.run(
        ["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"], capture_output=True
    )
    if rate is not None:
        cmd = ["tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate]
        # the bucket must hold at least one timer tick's worth of the rate (the kernel
        # refills it per tick: 4 ms at HZ 250), else tbf cannot reach the rate
        burst = max(1 << 20, rate_bits(rate) // 8 // 100)
        cmd += ["burst", str(burst), "latency", "50ms"]
        subprocess.run(["ip", "netns", "exec", ns, *cmd], check=True)


def rate_bits(rate: str) -> int:
    """Bits per second of a tc rate (``1gbit``, ``100mbit``, ``500kbit``)."""
    units = {"gbit": 10**9, "mbit": 10**6, "kbit": 10**3, "bit": 1}
    for unit, scale in units.items():
        if rate.lower().endswith(unit):
            return int(float(rate[: -len(unit)]) * scale)
    raise ValueError(f"a rate like 1gbit, 100mbit or 500kbit, not {rate!r}")


def require_root(what: str) -> str | None:
    """None when namespaces can be made here, else the reason they cannot."""
    if os.geteuid() != 0:
        return f"{what} needs root (network namespaces and a veth pair); run it with sudo"
    if shutil.which("ip") is None:
        return f"{what} needs the 'ip' command (iproute2)"
    return None


@contextmanager
def veth_link(mtu: int = 1500, prefix: str = "aq") -> Iterator[Link]:
    """Two fresh namespaces joined by a veth pair at ``mtu``, deleted on exit."""
    token = secrets.token_hex(3)
    subnet = 1 + int(token, 16) % 250  # 198.18.<subnet>.0/24: readable, unique-ish per run
    link = Link(
        server_ns=f"{prefix}-{token}-srv",
        client_ns=f"{prefix}-{token}-cli",
        server_if=f"{prefix}{token}s"[:15],
        client_if=f"{prefix}{token}c"[:15],
        server_ip=f"198.18.{subnet}.1",
        client_ip=f"198.18.{subnet}.2",
    )
    made: list[str] = []
    try:
        for ns in (link.server_ns, link.client_ns):
            subprocess.run(["ip", "netns", "add", ns], check=True)
            made.append(ns)
        ip = ["ip"]
        subprocess.run(
            [*ip, "link", "add", link.server_if, "type", "veth", "peer", "name", link.client_if],
            check=True,
        )
        for ns, dev, addr in (
            (link.server_ns, link.server_if, link.server_ip),
            (link.client_ns, link.client_if, link.client_ip),
        ):
            subprocess.run([*ip, "link", "set", dev, "netns", ns], check=True)
            subprocess.run([*ip, "-n", ns, "addr", "add", f"{addr}/24", "dev", dev], check=True)
            subprocess.run([*ip, "-n", ns, "link", "set", dev, "mtu", str(mtu), "up"], check=True)
            subprocess.run([*ip, "-n", ns, "link", "set", "lo", "up"], check=True)
        yield link
    finally:
        for ns in made:  # deleting a namespace deletes its end of the veth, and so the pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@dataclass
class Host:
    """One "host" on a :func:`bridged_hosts` switch: namespace ``ns``, its interface ``dev``
    with address ``ip``, and ``port``, the switch's side of its cable."""

    name: str
    ns: str
    dev: str
    port: str
    ip: str
    hub: str

    def shape(self, rate: str | None) -> None:
        """Make this host's cable a ``rate`` link, both ways (what it sends, what the
        switch sends it)."""
        shape(self.ns, self.dev, rate)
        shape(self.hub, self.port, rate)

    def counter(self, name: str) -> int:
        """``rx_bytes`` or ``tx_bytes`` of this host's interface so far."""
        path = f"/sys/class/net/{self.dev}/statistics/{name}"
        out = subprocess.run(
            ["ip", "netns", "exec", self.ns, "cat", path], capture_output=True, text=True
        )
        return int(out.stdout)


@contextmanager
def bridged_hosts(names: list[str], mtu: int = 1500, prefix: str = "aqs") -> Iterator[list[Host]]:
    """A namespace per name, each joined by a veth pair (its "cable") to a bridge (the
    "switch") in a namespace of its own, on one /24 of 198.18.0.0/15; deleted on exit."""
    token = secrets.token_hex(3)
    subnet = 1 + int(token, 16) % 250
    hub = f"{prefix}-{token}-hub"
    bridge = f"{prefix}{token}br"
    made: list[str] = []
    try:
        for ns in (hub, *(f"{prefix}-{token}-{name}" for name in names)):
            subprocess.run(["ip", "netns", "add", ns], check=True)
            made.append(ns)
            subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        subprocess.run(["ip", "-n", hub, "link", "add", bridge, "type", "bridge"], check=True)
        subprocess.run(["ip", "-n", hub, "link", "set", bridge, "up"], check=True)
        hosts = []
        for k, name in enumerate(names):
            host = Host(
                name,
                f"{prefix}-{token}-{name}",
                f"{prefix}{token}h{k}",
                f"{prefix}{token}p{k}",
                f"198.18.{subnet}.{k + 1}",
                hub,
            )
            subprocess.run(
                ["ip", "link", "add", host.dev, "type", "veth", "peer", "name", host.port],
                check=True,
            )
            subprocess.run(["ip", "link", "set", host.dev, "netns", host.ns], check=True)
            subprocess.run(["ip", "link", "set", host.port, "netns", hub], check=True)
            ip_ns = ["ip", "-n", host.ns]
            subprocess.run([*ip_ns, "addr", "add", f"{host.ip}/24", "dev", host.dev], check=True)
            subprocess.run([*ip_ns, "link", "set", host.dev, "mtu", str(mtu), "up"], check=True)
            subprocess.run(
                ["ip", "-n", hub, "link", "set", host.port, "mtu", str(mtu), "master", bridge],
                check=True,
            )
            subprocess.run(["ip", "-n", hub, "link", "set", host.port, "up"], check=True)
            hosts.append(host)
        yield hosts
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def spawn_in(
    ns: str, args: list[str], ready: str, timeout: float = 120, stderr: Any = None
) -> tuple[Any, str]:
    """Start ``python args...`` inside namespace ``ns``; wait for its ``ready`` line
    (``stderr``: a file for its log, else ours). ``ip netns exec`` execs the command, so the
    process id is the Python process's."""
    proc = subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        cwd=ROOT,
        env={**os.environ, "AQUEDUCT_TOKEN": ""},
    )
    return proc, wait_ready(proc, ready, timeout, f"{args[:3]} in namespace {ns}")


def stop(proc: Any) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            pipe.close()


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) used so far by process ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rx_bytes(dev: str) -> int:
    """Bytes received so far on interface ``dev`` of this process's namespace (what the
    wire carried to it: headers, TLS and retransmissions included)."""
    return int(Path(f"/sys/class/net/{dev}/statistics/rx_bytes").read_text())
