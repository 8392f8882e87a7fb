"""A relay in a process of its own, for tests that SIGKILL a host mid-transfer.

    relay = Relay.start(service_port)        # TCP and UDP on one free loopback port
    os.kill(relay.proc.pid, signal.SIGKILL)  # the host's service is gone

Connections to ``relay.port`` (TCP) and datagrams to it (UDP: QUIC) are relayed byte for
byte to ``127.0.0.1:TARGET`` (TLS ends at the target, so a client pins the target's
certificate). What a client sees when the relay is killed is what it sees when a service
process is killed on a host that stays up: the kernel closes the process's sockets (a TCP
connection ends) and answers datagrams to its port with ICMP port unreachable. The relay
runs this file with the standard library only (``-I -S``), so it is up in tens of
milliseconds where a second ``aqueduct serve`` takes seconds on a loaded machine: a fast
test can afford it.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass

READY = "RELAY_PORT "
DATAGRAM = 1 << 17
"""Larger than any datagram (QUIC on loopback sends up to 65,507 bytes)."""


@dataclass
class Relay:
    proc: subprocess.Popen[str]
    port: int

    @classmethod
    def start(cls, target: int) -> Relay:
        """A relay to ``127.0.0.1:target``, listening once this returns."""
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", __file__, str(target)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the relay prints it first thing, or exits
        if not line.startswith(READY):
            proc.kill()
            proc.wait()
            proc.stdout.close()
            raise RuntimeError(f"the relay did not start (exit {proc.poll()})")
        return cls(proc, int(line[len(READY) :]))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(1 << 16):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _start(target: int, listener: socket.socket, udp: socket.socket) -> None:
    def tcp() -> None:
        while True:
            front, _ = listener.accept()
            try:
                back = socket.create_connection(("127.0.0.1", target))
            except OSError:
                front.close()
                continue
            for src, dst in ((front, back), (back, front)):
                threading.Thread(target=_pipe, args=(src, dst), daemon=True).start()

    def answers(up: socket.socket, client: tuple[str, int]) -> None:
        with contextlib.suppress(OSError):
            while True:
                udp.sendto(up.recv(DATAGRAM), client)

    ups: dict[tuple[str, int], socket.socket] = {}
    threading.Thread(target=tcp, daemon=True).start()
    while True:
        data, client = udp.recvfrom(DATAGRAM)
        up = ups.get(client)
        if up is None:
            up = ups[client] = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            up.connect(("127.0.0.1", target))
            threading.Thread(target=answers, args=(up, client), daemon=True).start()
        with contextlib.suppress(OSError):
            up.send(data)


def _serve(target: int) -> None:
    while True:  # one port for both: a free TCP port whose UDP twin is free too
        listener = socket.create_server(("127.0.0.1", 0))
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            udp.bind(listener.getsockname())
            break
        except OSError:
            udp.close()
            listener.close()
    print(READY + str(listener.getsockname()[1]), flush=True)
    _start(target, listener, udp)


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
