"""``python -m zrecord.bench``: random gathers from Python, each next to a baseline from the
same run.

- zrecord gathers of 1,024 random indices into a preallocated NumPy array vs NumPy memmap
  fancy indexing of the same rows of a plain row file (1 KiB and 16 KiB records);
- the same gathers from a Rust loop in the same process (no Python between gathers), the
  bound of what a Python caller can reach;
- the prefetching ``Loader`` vs a bare gather loop over the same batches;
- a ``Loader`` over a mixture of three datasets vs over one dataset of the same records;
- with PyTorch installed: a ``DataLoader`` (2 workers, batches of 256) over zrecord
  (``MapDataset``, ``StatefulSampler``, ``collate``) vs over an in-memory ``TensorDataset`` of
  the same records (shuffled, torch's default collate);
- token windows: random windows of 2,049 uint32 tokens in batches of 32 from a token stream
  (``Windows.gather(out=)``, tokens only and with each token's document) vs NumPy memmap
  slicing of the same ``tokens.bin`` (and ``np.searchsorted`` over the document ends);
- with Grain installed: Grain iterating whole batches from zrecord (``zrecord.grain.batches``)
  vs Grain batching a NumPy array source (``MapDataset.source(array).batch(B)``), in process,
  each from a fresh iterator in its turn;
- packed rows of a stream: the loader vs a bare loop gathering the same batches.

Warm cache: both files are read once before timing.
"""

from __future__ import annotations

import argparse
import importlib
import os
import tempfile
import time

import numpy as np

import zrecord


def _rate(fn, seconds: float) -> float:
    """Calls of ``fn`` per second over about ``seconds``."""
    fn()
    calls, started = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - started
        if elapsed >= seconds:
            return calls / elapsed


def _in_turns(rounds: int, *methods) -> list[float]:
    """Each of ``methods`` (each returning a rate) called once a round, in turns, so that a
    shared machine's changing load weighs on all alike: their mean rates."""
    totals = [0.0] * len(methods)
    for _ in range(rounds):
        for k, method in enumerate(methods):
            totals[k] += method()
    return [total / rounds for total in totals]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000, help="records per dataset (1 KiB); 16 KiB ones get a sixteenth")
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--seconds", type=float, default=2.0, help="per measurement (taken in turns)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory() as tmp:
        for size in (1024, 16384):
            n = args.records if size == 1024 else max(args.records // 16, args.batch)
            rows = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
            path = os.path.join(tmp, f"zr-{size}")
            ds = zrecord.from_numpy(rows, path)
            raw = os.path.join(tmp, f"rows-{size}.bin")
            rows.tofile(raw)
            mm = np.memmap(raw, dtype=np.uint8, mode="r", shape=(n, size))
            del rows
            out = np.empty((args.batch, size), dtype=np.uint8)
            batches = [rng.integers(0, n, size=args.batch, dtype=np.uint64) for _ in range(64)]
            k = [0]

            def next_batch():
                k[0] = (k[0] + 1) % len(batches)
                return batches[k[0]]

            # Warm both.
            ds.gather(np.arange(n, dtype=np.uint64), out={"data": np.empty((n, size), np.uint8)})
            np.asarray(mm[np.arange(n)]).sum()
            zr, npm = 0.0, 0.0
            native = ds._native()
            direct = 0.0
            for _ in range(args.rounds):
                zr += _rate(lambda: ds.gather(next_batch(), out={"data": out}), args.seconds / args.rounds)
                npm += _rate(lambda: np.take(mm, next_batch().astype(np.int64), axis=0, out=out), args.seconds / args.rounds)
                direct += native.time_gathers(batches, "data", out.reshape(-1), args.seconds / args.rounds)
            zr, npm, direct = (x / args.rounds * args.batch for x in (zr, npm, direct))
            gib = size / (1 << 30)
            print(f"{size // 1024:>2} KiB records, {n} of them, random batches of {args.batch}:")
            print(f"  zrecord Dataset.gather(out=)   {zr:>12,.0f} rec/s  {zr * gib:6.2f} GiB/s")
            print(f"  numpy memmap fancy indexing    {npm:>12,.0f} rec/s  {npm * gib:6.2f} GiB/s   zrecord/numpy {zr / npm:.2f}x")
            print(f"  the same gathers in a Rust loop {direct:>11,.0f} rec/s  {direct * gib:6.2f} GiB/s   Python/Rust {zr / direct:.2f}x")
        # The loader vs a bare loop over the same batches.
        ds = zrecord.open(os.path.join(tmp, "zr-1024"))
        print(f"loader (prefetch 2, 2 workers) {_loader_vs_bare(ds, args.batch, 200, args.rounds)}")
        _mixture(tmp, ds, args)
        _stream(tmp, args)
        _packed(tmp, args)
        _torch(ds, args)
        _grain(ds, args)


def _stream(tmp, args, tokens: int = 64 << 20, seq_len: int = 2048, batch: int = 32) -> None:
    """Random windows from a token stream vs memmap slicing of its own tokens file."""
    rng = np.random.default_rng(11)
    path = os.path.join(tmp, "stream")
    with zrecord.create_stream(path) as s:
        left = tokens
        while left:
            n = int(min(left, rng.integers(1, 4000)))
            s.append_document(rng.integers(0, 1 << 31, size=n, dtype=np.uint32))
            left -= n
    stream = zrecord.open_stream(path)
    windows = stream.windows(seq_len)
    n, width = len(windows), seq_len + 1
    mm = np.memmap(os.path.join(path, "tokens.bin"), dtype=np.uint32, mode="r")
    ends = np.array([stream._native().document(d)[1] for d in range(stream.documents)], dtype=np.int64)
    np.asarray(mm).sum()  # warm
    batches = [rng.integers(0, n, size=batch, dtype=np.uint64) for _ in range(64)]
    k = [0]

    def next_batch():
        k[0] = (k[0] + 1) % len(batches)
        return batches[k[0]]

    tokens_out = np.empty((batch, width), np.uint32)
    documents_out = np.empty((batch, width), np.int64)
    offsets = np.arange(width, dtype=np.int64)

    def memmap_slices(with_documents: bool):
        starts = next_batch().astype(np.int64) * seq_len
        for row, start in enumerate(starts):
            tokens_out[row] = mm[start : start + width]
        if with_documents:
            positions = starts[:, None] + offsets
            documents_out[...] = np.searchsorted(ends, positions, side="right")

    rates = {"zr": 0.0, "np": 0.0, "zr_docs": 0.0, "np_docs": 0.0}
    for _ in range(args.rounds):
        part = args.seconds / args.rounds
        rates["zr"] += _rate(lambda: windows.gather(next_batch(), fields=["tokens"], out={"tokens": tokens_out}), part)
        rates["np"] += _rate(lambda: memmap_slices(False), part)
        rates["zr_docs"] += _rate(lambda: windows.gather(next_batch(), out={"tokens": tokens_out, "document": documents_out}), part)
        rates["np_docs"] += _rate(lambda: memmap_slices(True), part)
    zr, npm, zr_docs, np_docs = (rates[key] / args.rounds * batch for key in ("zr", "np", "zr_docs", "np_docs"))
    print(f"token windows of {width} uint32 tokens, {len(stream):,} tokens in {stream.documents:,} documents, random batches of {batch}:")
    print(f"  zrecord Windows.gather(out=), tokens      {zr:>10,.0f} windows/s")
    print(f"  numpy memmap slicing                      {npm:>10,.0f} windows/s   zrecord/numpy {zr / npm:.2f}x")
    print(f"  zrecord, tokens + documents               {zr_docs:>10,.0f} windows/s")
    print(f"  numpy slicing + searchsorted documents    {np_docs:>10,.0f} windows/s   zrecord/numpy {zr_docs / np_docs:.2f}x")


def _packed(tmp, args, seq_len: int = 2048, batch: int = 32, count: int = 300) -> None:
    """The loader over a stream's packed rows vs a bare loop gathering the same batches."""
    stream = zrecord.open_stream(os.path.join(tmp, "stream"))  # made by _stream
    packed = stream.packed(seq_len)
    stats = packed.stats()

    print(f"packed rows of {seq_len + 1} tokens ({stats['rows']:,} rows, {100 * stats['padding_fraction']:.2f}% padding), batches of {batch}, every column:")
    print(f"  loader (prefetch 2, 2 workers) {_loader_vs_bare(packed, batch, count, args.rounds)}")


def _loader_vs_bare(source, batch: int, count: int, rounds: int) -> str:
    """A loader over ``source`` (prefetch 2, 2 workers) vs a bare loop gathering the same
    ``count`` shuffled batches of ``batch``, in turns, warm: their rates, said."""

    def sampler():
        return zrecord.Sampler(len(source), order="shuffle", seed=1, batch=batch)

    batches = [sampler().batch_at(0, p) for p in range(0, min(len(source), count * batch), batch)]
    for b in batches:  # warm: every record read once
        source.gather(b)
    bare = looped = 0.0
    for _ in range(rounds):  # in turns
        started = time.perf_counter()
        for b in batches:
            source.gather(b)
        bare += time.perf_counter() - started
        loader = zrecord.Loader(source, sampler(), prefetch=2, workers=2)
        started = time.perf_counter()
        for i, _ in enumerate(loader):
            if i + 1 == len(batches):
                break
        looped += time.perf_counter() - started
    return f"{len(batches) / looped:,.0f} batches/s vs a bare gather loop {len(batches) / bare:,.0f}: loader/bare {bare / looped:.2f}x"


def _mixture(tmp, ds, args) -> None:
    """The loader over three datasets (half, three tenths and a fifth of ``ds``'s records,
    weighted so) vs over ``ds`` itself, the same number of batches each."""
    n = len(ds)
    cuts = [0, n // 2, n // 2 + 3 * n // 10, n]
    parts = []
    for k in range(3):
        rows = ds.gather(np.arange(cuts[k], cuts[k + 1]))["data"]
        parts.append(zrecord.from_numpy(rows, os.path.join(tmp, f"part-{k}")))
    lengths = [len(p) for p in parts]
    count = min(200, n // args.batch)

    def batches_per_second(make_loader):
        def run() -> float:
            loader = make_loader()
            started = time.perf_counter()
            for i, _ in enumerate(loader):
                if i + 1 == count:
                    break
            return count / (time.perf_counter() - started)

        return run

    one, mixed = _in_turns(
        args.rounds,
        batches_per_second(lambda: zrecord.Loader(ds, zrecord.Sampler(n, seed=4, batch=args.batch), prefetch=2, workers=2)),
        batches_per_second(lambda: zrecord.Loader(parts, zrecord.Mixture(lengths, lengths, seed=4, batch=args.batch), prefetch=2, workers=2)),
    )
    print(f"loader over a 3-dataset mixture {mixed:,.0f} batches/s vs over one dataset of the same records {one:,.0f}: mixture/one {mixed / one:.2f}x")


def _optional(module: str):
    """The module ``module``, or None (said) when it is not installed: the comparisons with
    optional frameworks are skipped without them."""
    try:
        return importlib.import_module(module)
    except ImportError:
        print(f"{module}: not installed (pip install {module}), skipped")
        return None


def _torch(ds, args) -> None:
    torch = _optional("torch")
    if torch is None:
        return
    from zrecord.torch import MapDataset, StatefulSampler, collate  # noqa: PLC0415

    batch, count = 256, 300
    tensors = torch.utils.data.TensorDataset(torch.from_numpy(ds.gather(np.arange(len(ds)))["data"]))

    def rate(loader) -> float:
        it = iter(loader)
        next(it)  # workers started
        started = time.perf_counter()
        for _ in range(count):
            next(it)
        return count / (time.perf_counter() - started)

    def ours() -> float:
        sampler = StatefulSampler(zrecord.Sampler(len(ds), seed=3, batch=batch))
        return rate(torch.utils.data.DataLoader(MapDataset(ds), batch_sampler=sampler, num_workers=2, collate_fn=collate))

    zr, npy = _in_turns(
        args.rounds,
        ours,
        lambda: rate(torch.utils.data.DataLoader(tensors, batch_size=batch, shuffle=True, num_workers=2)),
    )
    print(f"torch DataLoader, 2 workers, batches of {batch} (1 KiB records): zrecord {zr:,.0f} batches/s vs an in-memory TensorDataset {npy:,.0f}: {zr / npy:.2f}x")


def _grain(ds, args) -> None:
    grain = _optional("grain")
    if grain is None:
        return
    from zrecord.grain import batches  # noqa: PLC0415

    count = min(200, len(ds) // args.batch)
    rows = ds.gather(np.arange(len(ds)))["data"]  # the same records, in memory
    sampler = zrecord.Sampler(len(ds), order="shuffle", seed=2, batch=args.batch)
    steps = count // args.rounds

    def batches_per_second(make_iter):
        # A fresh iterator for each turn, its start timed too: one made earlier fills its
        # prefetch buffer on Grain's threads while the other is timed.
        def run() -> float:
            started = time.perf_counter()
            it = make_iter()
            for _ in range(steps):
                next(it)
            return steps / (time.perf_counter() - started)

        return run

    zr, npy = _in_turns(
        args.rounds,
        batches_per_second(lambda: iter(batches(ds, sampler).to_iter_dataset())),
        batches_per_second(lambda: iter(grain.MapDataset.source(rows).shuffle(seed=2).batch(args.batch).to_iter_dataset())),
    )
    print(f"grain, batches of {args.batch} (1 KiB records): zrecord.grain.batches {zr:,.0f} batches/s vs a NumPy array source batched by Grain {npy:,.0f}: {zr / npy:.2f}x")


if __name__ == "__main__":
    main()
