"""Write notebooks/*.ipynb from the cells below (outputs empty; tests execute them)."""

from pathlib import Path

import nbformat as nbf

HERE = Path(__file__).resolve().parents[1] / "notebooks"


def notebook(cells: list[tuple[str, str]]) -> nbf.NotebookNode:
    nb = nbf.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.cells = [
        nbf.v4.new_markdown_cell(src) if kind == "md" else nbf.v4.new_code_cell(src)
        for kind, src in cells
    ]
    return nb


QUICKSTART = [
    (
        "md",
        "# Aqueduct for Spark: quickstart\n\nA local dataset service, Spark in local mode, batch reads and writes, the Python client, and a streaming query. Everything runs on this machine.",
    ),
    (
        "code",
        "import os, sys, tempfile, time\nfrom pathlib import Path\n\nos.environ['PYSPARK_PYTHON'] = sys.executable  # Spark's workers must use this interpreter\n\nfrom aqueduct_spark.testing import start_service\n\nworkdir = Path(tempfile.mkdtemp(prefix='aqueduct-notebook-'))\nsvc = start_service(workdir / 'datasets')  # `aqueduct serve` on a free loopback port\nprint(svc.url)",
    ),
    (
        "md",
        "## Spark\n\n`register(spark)` makes `format('aqueduct')` available (installing the package registers it automatically too). Every option is in `docs/spark-options.md`.",
    ),
    (
        "code",
        "from pyspark.sql import SparkSession\nfrom aqueduct_spark.datasource import register\n\nspark = (SparkSession.builder.master('local[2]')\n         .config('spark.ui.enabled', 'false')\n         .config('spark.sql.execution.arrow.maxBytesPerBatch', '2147483647')\n         .config('spark.sql.python.filterPushdown.enabled', 'true')\n         .getOrCreate())\nspark.sparkContext.setLogLevel('ERROR')\nregister(spark)\noptions = svc.options  # url and the certificate fingerprint to pin\noptions",
    ),
    (
        "code",
        "trips = spark.range(0, 100_000, numPartitions=2).selectExpr(\n    'id as trip_id', 'cast(id % 97 as double) / 3 as distance_km',\n    \"element_at(array('bike', 'bus', 'car'), cast(id % 3 + 1 as int)) as mode\")\ntrips.write.format('aqueduct').options(**options).mode('overwrite').save('trips')\n\ndf = spark.read.format('aqueduct').options(**options).load('trips')\nlong = df.filter('distance_km > 30').groupBy('mode').count().orderBy('mode')\nlong.show()\nassert df.count() == 100_000",
    ),
    ("md", "## Time travel and the Python client"),
    (
        "code",
        "trips.limit(10).write.format('aqueduct').options(**options).mode('append').save('trips')\nprint(spark.read.format('aqueduct').options(**options).load('trips').count())\nprint(spark.read.format('aqueduct').options(**options).option('versionAsOf', '0').load('trips').count())\n\nclient = svc.client()\ntable = client.read('trips', columns=['trip_id', 'mode'], filter=[('trip_id', '<', 5)])\nprint(table.to_pydict())\nprint([(d.name, d.version, d.rows) for d in client.list()])",
    ),
    (
        "md",
        "## Streaming, exactly once\n\nThe stream reads the versions of `trips` and appends each micro-batch to `trips_copy` in one idempotent commit. `availableNow` processes what is there and stops.",
    ),
    (
        "code",
        "query = (spark.readStream.format('aqueduct').options(**options).option('startingVersion', 'earliest')\n         .option('maxRowsPerTrigger', '40000').load('trips')\n         .writeStream.format('aqueduct').options(**options)\n         .option('checkpointLocation', str(workdir / 'checkpoint'))\n         .trigger(availableNow=True).start('trips_copy'))\nquery.awaitTermination(120)\nprint(len(query.recentProgress), 'micro-batches')\nprint(client.describe('trips_copy').rows, 'rows in trips_copy')\nassert client.describe('trips_copy').rows == client.describe('trips').rows",
    ),
    ("code", "spark.stop()\nsvc.stop()"),
]

PROTOCOL = [
    (
        "md",
        "# The Aqueduct protocol: channels inside channels\n\nAqueduct carries message channels inside one QUIC connection. A channel is created by *attaching* one half of a new channel to a message sent on an existing one; the first channel is the connection's entrypoint.",
    ),
    (
        "code",
        "import asyncio\nfrom aqueduct_core import channel, connect, oneshot, serve\n\nasync def handler(conn, requests):\n    async for request in requests:\n        if 'reply' in request:\n            request['reply'].send(request['x'] * 2)\n        if 'numbers' in request:\n            async with request['numbers'] as out:   # finished when the block ends\n                for i in range(request['count']):\n                    await out.send(i)\n\nasync def demo():\n    server = await serve(handler)\n    conn = await connect('127.0.0.1', server.port, tls=server.client_tls())\n    reply, answer = oneshot()                        # RPC: the request carries its answer channel\n    await conn.entrypoint.send({'x': 21, 'reply': reply})\n    print('answer', await answer)\n    tx, rx = channel()                               # a stream back to us\n    await conn.entrypoint.send({'numbers': tx, 'count': 5})\n    print('stream', [n async for n in rx])\n    conn.entrypoint.finish()\n    await conn.close(); await server.close()\n\nawait demo()",
    ),
    (
        "md",
        "## Loss and lost-in-transit\n\nOn an unreliable channel a message may be lost. Channels attached to a lost message can never reach the peer, so the protocol declares them *lost in transit* on both sides. Here the sans-IO engine runs over a simulated network that drops 40% of datagrams, deterministically (seed 3).",
    ),
    (
        "code",
        "from aqueduct_core.engine import Mode, NewChannel, Terminal\nfrom aqueduct_core.testing.simnet import SimNetwork\nfrom aqueduct_core.wire import ENTRYPOINT\n\nnet = SimNetwork(seed=3, loss=0.4)\nnet.handshake()\nclient, server = net.client, net.server\nclient.configure_sender(ENTRYPOINT, Mode.UNRELIABLE)\nkept = []\nfor i in range(10):  # each message carries a new channel; we keep its sender half\n    kept += client.send(ENTRYPOINT, f'msg {i}'.encode(), attachments=[NewChannel(keep_sender=True)], now=net.now)\nnet.run()\n\ndelivered = 0\nwhile (msg := server.recv(ENTRYPOINT, now=net.now)) is not None:\n    delivered += 1\n    for att in msg.attachments:\n        server.close_receiver(att.chanid, now=net.now)\nnet.run()\nlost = [c for c in kept if client.terminal(c) is Terminal.LOST_IN_TRANSIT]\nprint(f'{delivered} messages delivered, {len(lost)} attached channels lost in transit')\nassert delivered + len(lost) == 10",
    ),
    (
        "md",
        "## Flow control\n\nEach receiver grants a per-channel window of bytes; a sender never has more than the window outstanding (one message always goes, so any window makes progress). A consumer that stops reading holds at most the window plus one message.",
    ),
    (
        "code",
        "from aqueduct_core.engine import EngineConfig\nfrom aqueduct_core.testing.memory import memory_pair\n\nasync def flow():\n    async with memory_pair(config=EngineConfig(flow_window=64 * 1024)) as pair:\n        tx, rx = channel(codec='raw')\n        await pair.client.entrypoint.send({'in': rx})\n        inbox = (await pair.entrypoint_receiver.recv())['in']\n        tx.ordered(maxsize=4)\n        async def produce():\n            for _ in range(100):\n                await tx.send(b'x' * 16 * 1024)\n            tx.finish()\n        producer = asyncio.create_task(produce())\n        await asyncio.sleep(0.2)          # the consumer reads nothing for a while\n        buffered = pair.server.memory().received.get(inbox._chanid, 0)\n        print('buffered while stalled:', buffered, 'bytes (window 65536)')\n        assert buffered <= 64 * 1024 + 17 * 1024\n        got = sum([len(m) async for m in inbox])\n        await producer\n        print('received', got, 'bytes in the end')\n\nawait flow()",
    ),
]

if __name__ == "__main__":
    HERE.mkdir(exist_ok=True)
    nbf.write(notebook(QUICKSTART), HERE / "quickstart.ipynb")
    nbf.write(notebook(PROTOCOL), HERE / "protocol.ipynb")
    print("wrote", [p.name for p in HERE.glob("*.ipynb")])
