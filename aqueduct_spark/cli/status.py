"""``aqueduct status [URL]``: is a dataset service up, and how quickly does it answer?

It asks the service over its own protocol, with the same URL, trust and token options as
every client command, so it works from any machine that can use the service (the HTTP
``/health`` of ``--metrics-port`` is often bound to the service's host only). It connects and
lists the datasets twice: the first answer includes connecting (handshake and TLS), the
second is one request on the open connection. Then it asks the service process for its
staging: the bytes staged by transactions not yet committed, and those it expired. A service that answers, even with
``Unauthenticated`` for a missing or wrong token, is up (exit 0); one that cannot be reached
or fails is down (exit 1).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from typing import Any

from aqueduct_core.errors import AqueductError
from aqueduct_spark import protocol as P
from aqueduct_spark.cli.datasets import _client, _size


def cmd_status(args: argparse.Namespace) -> int:
    if args.target:
        args.url = args.target
    report: dict[str, Any] = {"url": args.url}
    client = _client(args, retries=0)  # a status is a measurement: no retries behind it
    try:
        started = time.perf_counter()
        try:
            datasets = client.list()
        except P.Unauthenticated as refused:
            report.update(status="up", authenticated=False, error=refused.message)
            report["first_answer_ms"] = _ms(started)
        else:
            report["first_answer_ms"] = _ms(started)
            again = time.perf_counter()
            client.list()
            report.update(status="up", authenticated=True, request_ms=_ms(again))
            report["transport"] = client.transport
            report["datasets"] = len(datasets)
            report["rows"] = sum(d.rows for d in datasets)
            report["bytes"] = sum(d.bytes for d in datasets)
            with contextlib.suppress(P.InvalidRequest):  # a service older than the request
                report["staging"] = client.status()
    except AqueductError as exc:
        if not args.json:
            raise  # printed like every other command's error, exit 1
        report.update(status="down", error=str(exc))  # what happened and the fix, no class
    finally:
        client.close()
    if args.json:
        print(json.dumps(report))
    else:
        _print(report)
    return 0 if report["status"] == "up" else 1


def _ms(since: float) -> float:
    return round((time.perf_counter() - since) * 1000, 1)


def _print(report: dict[str, Any]) -> None:
    print(f"service   {report['url']}")
    if not report["authenticated"]:
        print(
            "status    up, but it refused this client: pass the service's token with "
            "--token or AQUEDUCT_TOKEN"
        )
        print(f"refusal   {report['error']}")
        print(f"latency   {report['first_answer_ms']} ms to the refusal (connecting included)")
        return
    print(f"status    up, over {report['transport']}")
    print(
        f"latency   {report['first_answer_ms']} ms to the first answer (connecting "
        f"included), then {report['request_ms']} ms a request"
    )
    print(f"datasets  {report['datasets']} ({report['rows']:,} rows, {_size(report['bytes'])})")
    staging = report.get("staging")
    if staging:
        limit = _size(staging["max_staged_bytes_per_token"])
        if staging["limit_per"] == "token":
            yours = f"this token's {_size(staging['yours'])} of its {limit}"
        else:
            yours = f"at most {limit} a connection (the service has no tokens)"
        print(
            f"staging   {_size(staging['staged_bytes'])} uncommitted in "
            f"{_count(staging['staged_transactions'], 'transaction')} through this process; "
            f"{yours}"
        )
        print(
            f"expired   {_count(staging['expired_transactions'], 'transaction')} "
            f"({_size(staging['expired_bytes'])}) idle over "
            f"{staging['txn_lifetime_s'] / 3600:g} h, since the process started"
        )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
