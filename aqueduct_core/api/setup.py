"""Building the engine of a client or server connection with codec negotiation."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from aqueduct_core.api.codec import CODEC_HEADER, Codec, negotiate
from aqueduct_core.engine import Connection as Engine
from aqueduct_core.engine import EngineConfig
from aqueduct_core.wire.chanid import Side
from aqueduct_core.wire.primitives import Headers, check_headers

HeadersHook = Callable[[Headers], Iterable[tuple[bytes | str, bytes | str]]]
"""Server hook: the client's connection headers in, the server's headers out. Raise
:class:`aqueduct_core.errors.AqueductError` to refuse the connection."""


def client_engine(config: EngineConfig | None, headers: object, codecs: dict[str, Codec]) -> Engine:
    own = check_headers(headers or (), "connection headers")
    offered = ",".join(codecs).encode()
    return Engine(Side.CLIENT, config, headers=(*own, (CODEC_HEADER, offered)))


def server_engine(
    config: EngineConfig | None, hook: HeadersHook | None, codecs: dict[str, Codec]
) -> Engine:
    def answer(client: Headers) -> Headers:
        own = check_headers(hook(client) if hook is not None else (), "server headers")
        offered = next((v for k, v in client if k == CODEC_HEADER), b"cbor")
        chosen = negotiate(offered, codecs)
        name = chosen.name if chosen is not None else "cbor"
        return (*own, (CODEC_HEADER, name.encode()))

    return Engine(Side.SERVER, config, server_headers=answer)
