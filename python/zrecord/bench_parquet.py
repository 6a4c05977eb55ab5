"""Parquet in: ``zr convert --parquet`` against pyarrow reading the same file plus a NumPy
copy of its columns' buffers, in the same run (needs pyarrow)::

    python -m zrecord.bench_parquet [--rows 200000] [--zr PATH]

The file holds a binary column of 500 to 3,000 bytes a row, a string column and an int64
column, snappy-compressed as pyarrow writes it by default. Each side's best of three.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time

import numpy as np


def main() -> None:
    import pyarrow as pa  # noqa: PLC0415 - optional
    import pyarrow.parquet as pq  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--zr", default=shutil.which("zr") or "zr")
    args = parser.parse_args()
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory() as tmp:
        blobs = [rng.integers(0, 256, size=int(s), dtype=np.uint8).tobytes() for s in rng.integers(500, 3000, args.rows)]
        captions = [f"caption {k} " * 5 for k in range(args.rows)]
        table = pa.table({"image": pa.array(blobs, type=pa.binary()), "caption": pa.array(captions), "label": pa.array(np.arange(args.rows, dtype=np.int64))})
        path = os.path.join(tmp, "t.parquet")
        pq.write_table(table, path, compression="snappy")
        size = sum(map(len, blobs)) + sum(map(len, captions)) + 8 * args.rows
        ours = theirs = float("inf")
        for _ in range(3):
            dest = os.path.join(tmp, "ds")
            shutil.rmtree(dest, ignore_errors=True)
            started = time.perf_counter()
            subprocess.run([args.zr, "convert", dest, "--parquet", path], check=True, capture_output=True)
            ours = min(ours, time.perf_counter() - started)
            started = time.perf_counter()
            read = pq.read_table(path)
            for name in ("image", "caption"):
                buffers = read.column(name).combine_chunks().buffers()
                np.frombuffer(buffers[2], dtype=np.uint8).copy()
                np.frombuffer(buffers[1], dtype=np.int32).copy()
            read.column("label").to_numpy().copy()
            theirs = min(theirs, time.perf_counter() - started)
    mib = size / (1 << 20)
    print(f"{args.rows:,} rows, {mib:.0f} MiB of values:")
    print(f"  zr convert --parquet           {mib / ours:8.0f} MiB/s")
    print(f"  pyarrow read + NumPy copy      {mib / theirs:8.0f} MiB/s")
    print(f"  zr / pyarrow                   {theirs / ours:.2f}x")


if __name__ == "__main__":
    main()
