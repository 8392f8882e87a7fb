"""A table with the shape and entropy of NYC yellow taxi trips, made here (no download).

The real data (TLC trip records, ``yellow_tripdata_2023-01.parquet``) has 19 columns:
vendor, pickup and dropoff times to the second, passenger count and rate code (small
numbers stored as doubles, null together in ~2.5% of rows), trip distance in hundredths of a
mile, a one-letter flag, pickup and dropoff zones (1-265, a few zones far more frequent),
payment type, and eight money columns in cents that mostly take a handful of values
(surcharges) or follow the fare. This module draws each column from distributions of that
shape with numpy, chunk by chunk, seeded, so a benchmark makes the same table every time.

Not more compressible than the real data, checked (``python -m benchmarks.taxi``): the
published file of January 2023 holds 3,066,766 rows in 47,673,370 bytes of Parquet, 15.5
bytes per row; this table written the same way (Parquet, zstd, which compresses these
columns at least as well as the file's own codec) must take at least as many bytes per row.
It also prints the Arrow IPC lz4/zstd ratios the benchmarks see on it.
"""

from __future__ import annotations

import io
import sys
from typing import Any

import numpy as np
import pyarrow as pa

PUBLISHED_BYTES_PER_ROW = 47_673_370 / 3_066_766
"""yellow_tripdata_2023-01.parquet: bytes / rows (NYC TLC, as listed with the file)."""
JAN_2023 = 1_672_531_200  # 2023-01-01T00:00:00Z, seconds

SCHEMA = pa.schema(
    [
        ("VendorID", pa.int64()),
        ("tpep_pickup_datetime", pa.timestamp("us")),
        ("tpep_dropoff_datetime", pa.timestamp("us")),
        ("passenger_count", pa.float64()),
        ("trip_distance", pa.float64()),
        ("RatecodeID", pa.float64()),
        ("store_and_fwd_flag", pa.string()),
        ("PULocationID", pa.int64()),
        ("DOLocationID", pa.int64()),
        ("payment_type", pa.int64()),
        ("fare_amount", pa.float64()),
        ("extra", pa.float64()),
        ("mta_tax", pa.float64()),
        ("tip_amount", pa.float64()),
        ("tolls_amount", pa.float64()),
        ("improvement_surcharge", pa.float64()),
        ("total_amount", pa.float64()),
        ("congestion_surcharge", pa.float64()),
        ("airport_fee", pa.float64()),
    ]
)


def _choice(rng: Any, values: list[float], weights: list[float], n: int) -> Any:
    p = np.asarray(weights, dtype="float64")
    return rng.choice(np.asarray(values, dtype="float64"), size=n, p=p / p.sum())


def _zones(rng: Any, n: int) -> Any:
    """Zones 1-265, a few far more frequent (Manhattan, the airports): Zipf-like weights
    over a fixed shuffle of the zone numbers."""
    order = np.random.default_rng(265).permutation(np.arange(1, 266))
    weights = 1.0 / np.arange(1, 266) ** 1.1
    return rng.choice(order, size=n, p=weights / weights.sum()).astype("int64")


def taxi_table(rows: int, start: int = 0) -> pa.Table:
    """``rows`` trips; ``start`` seeds the chunk (the same rows for the same start)."""
    rng = np.random.default_rng(1_000_003 + start)
    n = rows
    # pickups over the month, busier by day; whole seconds, in roughly the order trips end
    day = rng.integers(0, 31, n)
    hour = _choice(
        rng,
        list(range(24)),
        [2, 1, 1, 1, 1, 2, 4, 6, 7, 7, 7, 7, 8, 8, 8, 9, 9, 9, 9, 8, 7, 6, 5, 3],
        n,
    )
    pickup = JAN_2023 + day * 86400 + hour.astype("int64") * 3600 + rng.integers(0, 3600, n)
    pickup.sort()
    pickup += rng.integers(-600, 600, n)  # files are ordered by upload, roughly by time
    minutes = np.clip(rng.lognormal(2.4, 0.75, n), 0.05, 300)
    dropoff = pickup + (minutes * 60).astype("int64")
    distance = np.round(np.clip(rng.lognormal(0.6, 0.95, n), 0, 200), 2)
    vendor1 = rng.random(n) < 0.27
    distance = np.where(vendor1, np.round(distance, 1), distance)  # vendor 1: tenths
    missing = rng.random(n) < 0.025  # passenger count, rate code and flag unknown together
    passengers = _choice(rng, [0, 1, 2, 3, 4, 5, 6], [2, 74, 15, 4, 2, 2, 1], n)
    ratecode = _choice(rng, [1, 2, 3, 4, 5, 99], [940, 38, 3, 2, 15, 2], n)
    airport = ratecode == 2
    fare = np.where(airport, 70.0, np.round(3.0 + 0.7 * np.round(distance * 5 + minutes * 0.4), 2))
    fare = np.where(ratecode == 5, np.round(rng.uniform(5, 120, n), 2), fare)
    payment = np.where(missing, 0, _choice(rng, [1, 2, 3, 4], [78, 19, 1, 2], n)).astype("int64")
    extra = _choice(rng, [0, 1, 2.5, 3.5, 5, 6], [40, 25, 18, 10, 5, 2], n)
    mta = _choice(rng, [0.5, 0.0, -0.5], [985, 13, 2], n)
    card = payment == 1
    tip = np.where(
        card, np.round(fare * rng.uniform(0.1, 0.3, n) + rng.integers(0, 100, n) / 100, 2), 0.0
    )
    tolls = np.where(rng.random(n) < 0.06, _choice(rng, [6.55, 12.75, 13.38], [8, 1, 1], n), 0.0)
    improvement = np.where(rng.random(n) < 0.98, 1.0, 0.3)
    congestion = np.where(rng.random(n) < 0.9, 2.5, 0.0)
    airport_fee = np.where(airport | (rng.random(n) < 0.05), 1.25, 0.0)
    total = np.round(fare + extra + mta + tip + tolls + improvement + congestion + airport_fee, 2)
    flag = np.where(rng.random(n) < 0.007, "Y", "N").astype(object)
    flag[missing] = None
    us = 1_000_000
    return pa.Table.from_arrays(
        [
            pa.array(np.where(vendor1, 1, 2).astype("int64")),
            pa.array(pickup * us, pa.timestamp("us")),
            pa.array(dropoff * us, pa.timestamp("us")),
            pa.array(passengers, mask=missing),
            pa.array(distance),
            pa.array(ratecode, mask=missing),
            pa.array(flag, pa.string()),
            pa.array(_zones(rng, n)),
            pa.array(_zones(rng, n)),
            pa.array(payment),
            pa.array(fare),
            pa.array(extra),
            pa.array(mta),
            pa.array(tip),
            pa.array(tolls),
            pa.array(improvement),
            pa.array(total),
            pa.array(np.where(missing, np.nan, congestion), mask=missing),
            pa.array(np.where(missing, np.nan, airport_fee), mask=missing),
        ],
        schema=SCHEMA,
    )


def checksum(table: pa.Table) -> int:
    """What a full read must add up to: the pickup zones and the totals in cents."""
    import pyarrow.compute as pc

    zones = pc.sum(table.column("PULocationID")).as_py() or 0
    cents = pc.sum(pc.round(pc.multiply(table.column("total_amount"), 100)).cast(pa.int64()))
    return int(zones) * 1_000_000_007 + int(cents.as_py() or 0)


def realism(rows: int = 1_000_000) -> dict[str, float]:
    """Parquet (zstd) bytes per row of this table against the published file's, and the
    Arrow IPC compression ratios the benchmarks meet on it."""
    import pyarrow.parquet as pq

    table = taxi_table(rows)
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    out = {
        "parquet_bytes_per_row": sink.tell() / rows,
        "published_bytes_per_row": PUBLISHED_BYTES_PER_ROW,
        "arrow_bytes_per_row": table.nbytes / rows,
    }
    from aqueduct_spark.protocol.arrow import batch_to_payload

    for codec in ("lz4", "zstd"):
        options = pa.ipc.IpcWriteOptions(compression=codec)
        batches = table.to_batches(max_chunksize=65536)
        wire = sum(len(batch_to_payload(b, options)) for b in batches)
        out[f"ipc_{codec}_ratio"] = wire / table.nbytes
    return out


if __name__ == "__main__":
    found = realism(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
    for key, value in found.items():
        print(f"{key:26} {value:.3f}")
    ok = found["parquet_bytes_per_row"] >= found["published_bytes_per_row"]
    print("not more compressible than the real file" if ok else "MORE compressible than real")
    sys.exit(0 if ok else 1)
