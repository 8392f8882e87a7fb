"""A TCP relay in a process of its own, for tests that SIGKILL a host mid-transfer.

    relay = TCPRelay.start(service_port)   # listens on a free loopback port: relay.port
    os.kill(relay.proc.pid, signal.SIGKILL)  # the host is gone: its kernel ends every
                                              # connection to it, as for a killed service

Connections to ``relay.port`` are relayed byte for byte to ``127.0.0.1:TARGET`` (TLS ends at
the target, so a client pins the target's certificate). What the client sees when the relay
is killed is what it sees when a service process is killed on its host: the kernel closes
the process's sockets. The relay runs this file with the standard library only (``-I -S``),
so it is up in tens of milliseconds where a second ``aqueduct serve`` takes seconds on a
loaded machine: a fast test can afford it.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass

READY = "RELAY_PORT "


@dataclass
class TCPRelay:
    proc: subprocess.Popen[str]
    port: int

    @classmethod
    def start(cls, target: int, timeout: float = 30.0) -> TCPRelay:
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
            raise RuntimeError(f"the TCP relay did not start (exit {proc.poll()})")
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


def _serve(target: int) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    print(READY + str(listener.getsockname()[1]), flush=True)
    while True:
        front, _ = listener.accept()
        try:
            back = socket.create_connection(("127.0.0.1", target))
        except OSError:
            front.close()
            continue
        for src, dst in ((front, back), (back, front)):
            threading.Thread(target=_pipe, args=(src, dst), daemon=True).start()


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
