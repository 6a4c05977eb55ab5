"""Token streams from Python: windows and documents against NumPy slicing, out=, spans,
structured elements, readers beside a writer, loaders and resume, Megatron files."""

import json
import pickle
import struct
import subprocess

import numpy as np
import pytest

import zrecord


def _documents(rng, count, high=50_000, longest=600):
    return [rng.integers(0, high, size=int(rng.integers(0, longest))).astype(np.uint32) for _ in range(count)]


def _make(path, docs, dtype=np.uint32, spans=None):
    with zrecord.create_stream(path, dtype=dtype) as s:
        for d, doc in enumerate(docs):
            s.append_document(doc, spans[d] if spans else ())
    return zrecord.open_stream(path)


def _document_of(docs):
    return np.concatenate([np.full(len(doc), d, dtype=np.int64) for d, doc in enumerate(docs)])


def test_windows_match_numpy_slicing(tmp_path):
    rng = np.random.default_rng(0)
    docs = _documents(rng, 200)
    stream = _make(tmp_path / "s", docs)
    flat = np.concatenate(docs)
    doc_of = _document_of(docs)
    assert len(stream) == flat.size and stream.documents == len(docs)
    assert stream.dtype == np.uint32
    np.testing.assert_array_equal(stream.document(3), docs[3])
    for seq_len, stride in [(127, 128), (64, 7), (2048, 2048)]:
        w = stream.windows(seq_len, stride)
        n = (flat.size - seq_len - 1) // stride + 1
        assert len(w) == n
        idx = rng.integers(0, n, size=50)
        batch = w.gather(idx)
        assert set(batch) == {"tokens", "document"}
        for row, i in enumerate(idx):
            s = i * stride
            np.testing.assert_array_equal(batch["tokens"][row], flat[s : s + seq_len + 1])
            np.testing.assert_array_equal(batch["document"][row], doc_of[s : s + seq_len + 1])
        # The same from the disk, around the page cache.
        direct = stream.windows(seq_len, stride, read="direct", uncached=True).gather(idx)
        np.testing.assert_array_equal(direct["tokens"], batch["tokens"])
        # Into caller-owned arrays: returned as given, filled.
        out = {"tokens": np.empty((idx.size, seq_len + 1), np.uint32), "document": np.empty((idx.size, seq_len + 1), np.int64)}
        got = w.gather(idx, out=out)
        assert got["tokens"] is out["tokens"]
        np.testing.assert_array_equal(out["tokens"], batch["tokens"])
        np.testing.assert_array_equal(out["document"], batch["document"])
        with pytest.raises(IndexError):
            w.gather([n])
    w = stream.windows(127, 128)
    with pytest.raises(ValueError, match="out\\['tokens'\\]"):
        w.gather([0], out={"tokens": np.empty((1, 128), np.uint16)})
    with pytest.raises(KeyError):
        w.gather([0], fields=["labels"])
    only = w.gather([0, 1], fields=["tokens"])
    assert set(only) == {"tokens"}
    np.testing.assert_array_equal(w[1]["tokens"], flat[128:256])
    rows = w.__getitems__([2, 0])
    np.testing.assert_array_equal(rows[1]["tokens"], flat[:128])


def test_document_mode_and_spans(tmp_path):
    rng = np.random.default_rng(1)
    docs = _documents(rng, 40, longest=300)
    spans = []
    for d, doc in enumerate(docs):
        mine = []
        if len(doc) > 2:
            mine.append((1, len(doc) - 1, f"doc {d} middle".encode()))
            mine.append((0, 1, f"doc {d} first"))
        spans.append(mine)
    stream = _make(tmp_path / "s", docs, spans=spans)
    assert stream.spans == sum(len(s) for s in spans)
    dw = stream.document_windows(99)
    assert len(dw) == len(docs)
    batch = dw.gather(np.arange(len(docs)))
    for d, doc in enumerate(docs):
        k = min(len(doc), 100)
        np.testing.assert_array_equal(batch["tokens"][d, :k], doc[:k])
        assert not batch["tokens"][d, k:].any()
        assert batch["mask"][d].sum() == k and batch["mask"].dtype == np.bool_
        assert (batch["document"][d, :k] == d).all() and (batch["document"][d, k:] == -1).all()
    # Spans clipped to each window, their metadata once per batch.
    flat = np.concatenate(docs)
    absolute = []
    start = 0
    for d, doc in enumerate(docs):
        for a, b, m in sorted(spans[d], key=lambda s: s[0]):
            absolute.append((start + a, start + b, m if isinstance(m, bytes) else m.encode()))
        start += len(doc)
    w = stream.windows(50, 50)
    idx = np.array([3, 0, 3, len(w) - 1])
    got = w.gather(idx)
    want = []
    for row, i in enumerate(idx):
        lo, hi = i * 50, i * 50 + 51
        for j, (a, b, _) in enumerate(absolute):
            if a < hi and b > lo:
                want.append((row, max(a, lo) - lo, min(b, hi) - lo, j))
    assert sorted(map(tuple, got["spans"].tolist())) == sorted(want)
    ids = sorted({h[3] for h in want})
    assert got["span_ids"].tolist() == ids
    assert got["metadata"] == [absolute[j][2] for j in ids]
    assert stream.span(ids[0])[2] == absolute[ids[0]][2]
    assert flat.size == len(stream)


def test_structured_and_uint16_elements(tmp_path):
    element = np.dtype([("token", "<u4"), ("concept", "<u2")])
    with zrecord.create_stream(tmp_path / "c", dtype=element) as s:
        doc = np.zeros(300, dtype=element)
        doc["token"] = np.arange(300)
        doc["concept"] = np.arange(300) % 11
        s.append_document(doc)
    stream = zrecord.open_stream(tmp_path / "c")
    assert stream.dtype == element
    batch = stream.windows(9, 10).gather([2])
    assert batch["tokens"].dtype == element
    np.testing.assert_array_equal(batch["tokens"][0]["concept"], np.arange(20, 30) % 11)
    small = _make(tmp_path / "u16", [np.arange(1000, dtype=np.uint16)], dtype=np.uint16)
    assert small.windows(9).gather([1])["tokens"].dtype == np.uint16
    with zrecord.create_stream(tmp_path / "u16b", dtype=np.uint16) as s:
        with pytest.raises(ValueError, match="do not fit"):
            s.append_document(np.array([70_000]))
    with pytest.raises(ValueError, match="uint16"):
        zrecord.create_stream(tmp_path / "f", dtype=np.float32)


def test_a_reader_sees_commits_and_pickles(tmp_path):
    writer = zrecord.create_stream(tmp_path / "s")
    reader = zrecord.open_stream(tmp_path / "s")
    writer.append_document(np.arange(100, dtype=np.uint32))
    assert len(reader) == 0
    writer.commit()
    assert len(reader) == 100
    w = reader.windows(9, 10)
    assert len(w) == 10
    writer.append_document(np.arange(50, dtype=np.uint32))
    writer.commit()
    assert len(w) == 15, "windows follow the stream's commits"
    clone = pickle.loads(pickle.dumps(w))
    np.testing.assert_array_equal(clone.gather([14])["tokens"][0], np.arange(40, 50))
    with pytest.raises(TypeError):
        pickle.dumps(writer)
    assert reader.verify() == []


def test_loader_and_resume_over_windows(tmp_path):
    rng = np.random.default_rng(2)
    docs = _documents(rng, 100)
    stream = _make(tmp_path / "s", docs)
    w = stream.windows(31, 32)
    sampler = zrecord.Sampler(len(w), seed=3, batch=8)
    whole = [b["tokens"].copy() for b in zrecord.Loader(w, sampler)]
    sampler = zrecord.Sampler(len(w), seed=3, batch=8)
    loader = zrecord.Loader(w, sampler)
    first = []
    for k, b in enumerate(loader):
        first.append(b["tokens"].copy())
        if k == 4:
            break
    state = loader.state_dict()
    again = zrecord.Sampler(len(w), seed=3, batch=8)
    again.load_state_dict(state)
    rest = [b["tokens"].copy() for b in zrecord.Loader(w, again)]
    assert len(first) + len(rest) == len(whole)
    for got, want in zip(first + rest, whole):
        np.testing.assert_array_equal(got, want)


def _write_megatron(prefix, docs, code):
    dtype = {8: np.uint16, 4: np.int32}[code]
    with open(f"{prefix}.bin", "wb") as f:
        for doc in docs:
            f.write(doc.astype(dtype).tobytes())
    lengths = np.array([len(d) for d in docs], dtype=np.int32)
    pointers = np.concatenate([[0], np.cumsum(lengths.astype(np.int64) * np.dtype(dtype).itemsize)[:-1]]).astype(np.int64)
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(docs)))
        f.write(struct.pack("<Q", len(docs) + 1))
        f.write(lengths.tobytes())
        f.write(pointers.tobytes())
        f.write(np.arange(len(docs) + 1, dtype=np.int64).tobytes())


def test_megatron_files_convert_with_the_cli(tmp_path, zr_binary):
    zr = zr_binary
    if zr is None:
        pytest.skip("no zr command: install it or build the workspace (cargo build)")
    rng = np.random.default_rng(4)
    docs = _documents(rng, 30, high=30_000)
    _write_megatron(tmp_path / "corpus", docs, 8)
    subprocess.run([zr, "convert", str(tmp_path / "s"), "--megatron", str(tmp_path / "corpus")], check=True, capture_output=True)
    stream = zrecord.open_stream(tmp_path / "s")
    assert stream.dtype == np.uint16
    flat = np.concatenate(docs).astype(np.uint16)
    w = stream.windows(63)
    np.testing.assert_array_equal(w.gather([2])["tokens"][0], flat[126:190])


def test_windows_as_a_map_dataset_and_a_grain_source(tmp_path):
    from zrecord.grain import DataSource
    from zrecord.torch import MapDataset

    docs = [np.arange(100, dtype=np.uint32), np.arange(100, 200, dtype=np.uint32)]
    stream = _make(tmp_path / "s", docs, spans=[[(10, 20, b"a")], [(0, 100, b"b")]])
    w = stream.windows(49, 50)
    for source in (MapDataset(w), DataSource(w)):
        assert len(source) == 4
        batch = source.__getitems__([1, 2])
        np.testing.assert_array_equal(batch[0]["tokens"], np.arange(50, 100))
        np.testing.assert_array_equal(batch[1]["document"], np.full(50, 1))
        assert batch[0]["spans"].tolist() == []
        assert batch[1]["spans"].tolist() == [[1, 0, 50, 1]]
        assert batch.columns["metadata"] == [b"b"]
        np.testing.assert_array_equal(source[0]["tokens"], np.arange(50))


def test_a_clusters_stream_reads_as_the_local_one(tmp_path):
    from zrecord.testing import LocalCluster

    rng = np.random.default_rng(5)
    docs = _documents(rng, 80, longest=900)
    local = _make(tmp_path / "s", docs)
    with LocalCluster(2, [("x", "raw")], replicas=1) as cluster:
        admin = zrecord.connect(cluster.router, cluster.certs, role="operator")
        writer = admin.create_stream("corpus", block_tokens=256)
        assert writer.dtype == np.uint32
        for k, doc in enumerate(docs):
            assert writer.append_document(doc) == k
            if k == 40:
                writer.commit()
        writer.commit()
        reader = zrecord.open_stream(zrecord.connect(cluster.router, cluster.certs, role="reader", dataset="corpus"))
        assert len(reader) == len(local) and reader.documents == local.documents
        w, lw = reader.windows(127, 100), local.windows(127, 100)
        assert len(w) == len(lw)
        idx = rng.integers(0, len(w), size=40)
        got, want = w.gather(idx), lw.gather(idx)
        np.testing.assert_array_equal(got["tokens"], want["tokens"])
        np.testing.assert_array_equal(got["document"], want["document"])
        out = {"tokens": np.empty((idx.size, 128), np.uint32)}
        assert w.gather(idx, fields=["tokens"], out=out)["tokens"] is out["tokens"]
        np.testing.assert_array_equal(out["tokens"], want["tokens"])
        seen = [b["tokens"] for b in zrecord.Loader(w, zrecord.Sampler(len(w), seed=1, batch=8))]
        assert sum(b.shape[0] for b in seen) == len(w)
        # Packed rows: the same as the local stream's, byte for byte, through a loader too.
        p, lp = reader.packed(127, lookahead=16, seed=3), local.packed(127, lookahead=16, seed=3)
        assert len(p) == len(lp) and p.stats() == lp.stats()
        rows = np.arange(len(p))
        got, want = p.gather(rows), lp.gather(rows)
        for name in ("tokens", "document", "segment_ids", "positions", "loss_mask", "cu_seqlens"):
            np.testing.assert_array_equal(got[name], want[name])
        loaded = [b["tokens"] for b in zrecord.Loader(p, zrecord.Sampler(len(p), seed=1, batch=4))]
        assert sum(b.shape[0] for b in loaded) == len(p)
        with pytest.raises(zrecord.Error, match="local"):
            reader.document_windows(16)
        with pytest.raises(IndexError):
            w.gather([len(w)])
        plain = admin.dataset("default")
        with pytest.raises(zrecord.Error, match="not a token stream"):
            zrecord.open_stream(plain)


def test_windows_in_a_mixture_with_records_of_the_same_shape(tmp_path):
    docs = [np.arange(k * 1000, k * 1000 + 700, dtype=np.uint32) for k in range(6)]
    a = _make(tmp_path / "a", docs[:3]).windows(63)
    b = _make(tmp_path / "b", docs[3:]).windows(63)
    mixture = zrecord.Mixture([len(a), len(b)], [0.5, 0.5], seed=2, batch=4)
    loader = zrecord.Loader([a, b], mixture, fields=["tokens", "document"])
    flat = [np.concatenate(docs[:3]), np.concatenate(docs[3:])]
    for k, batch in enumerate(loader):
        assert batch["tokens"].shape == (4, 64)
        source, index = mixture.batch_at(k)
        for row, (s, i) in enumerate(zip(source, index)):
            np.testing.assert_array_equal(batch["tokens"][row], flat[s][i * 63 : i * 63 + 64])
            assert batch["source"][row] == s
        if k == 5:
            break
    state = loader.state_dict()
    again = zrecord.Mixture([len(a), len(b)], [0.5, 0.5], seed=2, batch=4)
    resumed = zrecord.Loader([a, b], again)
    resumed.load_state_dict(state)
    first = next(iter(resumed))
    source, index = again.batch_at(6)
    np.testing.assert_array_equal(first["tokens"][0], flat[source[0]][index[0] * 63 : index[0] * 63 + 64])
    # Windows of another length do not mix with these.
    c = _make(tmp_path / "c", docs[:1]).windows(31)
    with pytest.raises(ValueError, match="field 'tokens'"):
        zrecord.Loader([a, c], zrecord.Mixture([len(a), len(c)], [0.5, 0.5], batch=4))


def _long_tailed(rng, count, width):
    """Document lengths as corpora have them: most short, a few many rows long."""
    lengths = rng.exponential(width / 6, count).astype(np.int64)
    lengths[rng.random(count) < 0.03] *= 12
    return lengths


def test_packed_rows_hold_every_document_once_and_their_columns_agree(tmp_path):
    rng = np.random.default_rng(5)
    width = 128
    lengths = _long_tailed(rng, 400, width)
    docs = [rng.integers(0, 50_000, size=int(n)).astype(np.uint32) for n in lengths]
    stream = _make(tmp_path / "s", docs)
    for packer in ("best_fit", "first_fit"):
        packed = stream.packed(width - 1, lookahead=64, packer=packer, seed=7)
        assert len(packed) == packed.stats()["rows"]
        batch = packed.gather(np.arange(len(packed)))
        tokens, segments, positions = batch["tokens"], batch["segment_ids"], batch["positions"]
        mask, document = batch["loss_mask"], batch["document"]
        assert tokens.shape == (len(packed), width) and tokens.dtype == np.uint32
        seen = [np.zeros(len(d), dtype=np.int64) for d in docs]
        boundaries = [0]
        inputs = width - 1
        for r in range(len(packed)):
            row_segments = segments[r]
            used = int((row_segments > 0).sum())
            assert (row_segments[used:] == 0).all() and (tokens[r, used:] == 0).all()
            assert (document[r, used:] == -1).all() and not mask[r, used:].any()
            at = 0
            for s in range(1, int(row_segments.max(initial=0)) + 1):
                where = np.flatnonzero(row_segments == s)
                assert where[0] == at and (np.diff(where) == 1).all(), "a piece is not contiguous"
                d = int(document[r, where[0]])
                assert (document[r, where] == d).all()
                np.testing.assert_array_equal(positions[r, where], np.arange(where.size))
                # The piece's tokens are the document's, from where the piece starts in it.
                start = _find(docs[d], tokens[r, where], seen[d])
                seen[d][start : start + where.size] += 1
                assert mask[r, where[:-1]].all() and not mask[r, where[-1]]
                end = min(at + where.size, inputs)
                if end > at:
                    boundaries.append(r * inputs + end)
                at += where.size
            if at < inputs:
                boundaries.append((r + 1) * inputs)
        for d, counts in enumerate(seen):
            assert (counts == 1).all(), f"document {d}: a token missing or twice"
        np.testing.assert_array_equal(batch["cu_seqlens"], np.array(boundaries, dtype=np.int32))
        assert batch["max_seqlen"] == int(np.diff(boundaries).max())
    with pytest.raises(ValueError, match="lookahead"):
        stream.packed(127, lookahead=0)
    with pytest.raises(ValueError, match="best_fit or first_fit"):
        stream.packed(127, packer="greedy")
    with pytest.raises(IndexError):
        stream.packed(127).gather([10**9])
    with pytest.raises(TypeError, match="list of names"):
        stream.packed(127).gather([0], fields="tokens")


def _find(doc, piece, seen):
    """Where ``piece`` lies in ``doc`` among the places not taken yet (pieces are whole
    rows' worth or a document's tail, so the first free match is the piece's own)."""
    n = piece.size
    for start in range(0, doc.size - n + 1):
        if seen[start] == 0 and np.array_equal(doc[start : start + n], piece):
            return start
    raise AssertionError("a piece that is no part of its document")


@pytest.mark.filterwarnings("ignore:.*left out of each epoch")
def test_a_packed_streams_blocklist_changes_only_the_rows_of_blocked_documents(tmp_path):
    rng = np.random.default_rng(15)
    docs = [rng.integers(0, 50_000, size=int(n)).astype(np.uint32) for n in _long_tailed(rng, 300, 64)]
    stream = _make(tmp_path / "s", docs)
    plain = stream.packed(63, lookahead=32, seed=2)
    rows = plain.gather(np.arange(len(plain)))
    blocked = sorted({int(d) for d in rows["document"][[0, 5, 9], 0]})
    packed = stream.packed(63, lookahead=32, seed=2, blocklist=blocked)
    assert len(packed) == len(plain), "every row keeps its place"
    got = packed.gather(np.arange(len(packed)))
    held = np.isin(rows["document"], blocked).any(axis=1)
    assert held.sum() >= len(blocked)
    for column in ("tokens", "document", "segment_ids", "positions", "loss_mask"):
        np.testing.assert_array_equal(got[column][~held], rows[column][~held])
    assert not np.isin(got["document"], blocked).any(), "a blocked document is read nowhere"
    for r in np.flatnonzero(held):
        kept = rows["tokens"][r][(rows["document"][r] >= 0) & ~np.isin(rows["document"][r], blocked)]
        used = int((got["segment_ids"][r] > 0).sum())
        np.testing.assert_array_equal(got["tokens"][r][:used], kept)
        assert (got["tokens"][r][used:] == 0).all()
    # The run's description carries it, and zr explain lists the rows without them.
    loader = zrecord.Loader(packed, zrecord.Sampler(len(packed), batch=4, seed=1))
    assert loader.describe()["datasets"][0]["blocked_documents"] == blocked
    with pytest.raises(ValueError, match=f"document {len(docs)}, and the stream holds {len(docs)}"):
        stream.packed(63, blocklist=[len(docs)])


def test_a_packed_loader_resumes_exactly_on_other_rank_counts(tmp_path):
    rng = np.random.default_rng(8)
    docs = [rng.integers(0, 50_000, size=int(n)).astype(np.uint32) for n in _long_tailed(rng, 300, 64)]
    stream = _make(tmp_path / "s", docs)
    packed = stream.packed(63, lookahead=32, seed=2)
    global_batch = 12

    def stream_of(ranks, state=None, stop=None):
        """The global batches read by ``ranks`` ranks, concatenated in rank order."""
        loaders = []
        for rank in range(ranks):
            sampler = zrecord.Sampler(len(packed), seed=4, batch=global_batch // ranks, rank=rank, ranks=ranks, drop_last=True)
            if state is not None:
                sampler.load_state_dict(state)
            loaders.append(zrecord.Loader(packed, sampler))
        out = []
        for k, batches in enumerate(zip(*loaders)):
            out.append(np.concatenate([b["tokens"] for b in batches]))
            for b in batches:
                assert b["cu_seqlens"][-1] == b["tokens"].shape[0] * 63
            if stop is not None and k + 1 == stop:
                return out, loaders[0].state_dict()
        return out, None

    whole, _ = stream_of(1)
    for before, after in [(2, 3), (4, 1), (1, 6)]:
        first, state = stream_of(before, stop=3)
        rest, _ = stream_of(after, state=state)
        got = first + rest
        assert len(got) == len(whole), (before, after)
        for a, b in zip(got, whole):
            # The same rows in each global batch (ranks take them in their own order).
            np.testing.assert_array_equal(a[np.lexsort(a.T[::-1])], b[np.lexsort(b.T[::-1])])


def test_best_fit_pads_no_more_than_grains_best_fit(tmp_path):
    grain = pytest.importorskip("grain")
    import grain.experimental as ge

    rng = np.random.default_rng(0)
    width = 1025
    # Lengths within a row (Grain cuts nothing), long-tailed.
    lengths = np.minimum(rng.exponential(200, 4000).astype(np.int64) + 1, width)
    docs = [np.ones(int(n), dtype=np.uint32) for n in lengths]
    stream = _make(tmp_path / "s", docs)
    ours = stream.packed(width - 1, lookahead=1024).stats()["padding_fraction"]
    first = stream.packed(width - 1, lookahead=1024, packer="first_fit").stats()["padding_fraction"]
    source = grain.MapDataset.source([{"tokens": d.astype(np.int32)} for d in docs]).to_iter_dataset()
    theirs_packed = ge.BestFitPackIterDataset(source, length_struct={"tokens": width}, num_packing_bins=256, shuffle_bins=False)
    rows = sum(1 for _ in theirs_packed)
    theirs = 1 - int(lengths.sum()) / (rows * width)
    print(f"padding: ours best_fit {ours:.4f}, first_fit {first:.4f}; grain best-fit (256 bins) {theirs:.4f}")
    assert ours <= theirs
    assert ours <= first


def test_a_ramped_loader_over_packed_rows_resumes_across_a_stage_on_other_ranks(tmp_path, zr_binary):
    rng = np.random.default_rng(9)
    docs = [rng.integers(0, 50_000, size=int(n)).astype(np.uint32) for n in _long_tailed(rng, 400, 64)]
    stream = _make(tmp_path / "s", docs)
    packed = stream.packed(63, lookahead=32, seed=1)
    ramp = dict(global_batch=24, ramp=(8, 8, 96), seed=5)

    def run(ranks, state=None, steps=20):
        samplers = [zrecord.RampSampler(len(packed), rank=r, ranks=ranks, **ramp) for r in range(ranks)]
        loaders = [zrecord.Loader(packed, s) for s in samplers]
        if state is not None:
            for loader in loaders:
                loader.load_state_dict(state)
        out = []
        for k, batches in enumerate(zip(*loaders)):
            sizes = {b["tokens"].shape[0] for b in batches}
            assert len(sizes) == 1, "ranks got slices of one size"
            out.append(np.concatenate([b["tokens"] for b in batches]))
            if k + 1 == steps:
                break
        return out, loaders[0].state_dict()

    whole, _ = run(1, steps=20)
    # Two increments over 96 samples: one every 48.
    assert [w.shape[0] for w in whole[:11]] == [8] * 6 + [16] * 3 + [24] * 2
    # What each step held, computed from the run's description, is what was read; and the
    # command line lists the rows' documents and token ranges.
    described = zrecord.Loader(packed, zrecord.RampSampler(len(packed), rank=0, ranks=2, **ramp))
    for step in (0, 5, 6, 13, 19):
        manifest = described.manifest(step)
        assert [m["rank"] for m in manifest] == sorted(m["rank"] for m in manifest)
        records = [m["record"] for m in manifest]
        np.testing.assert_array_equal(packed.gather(records, ["tokens"])["tokens"], whole[step])
    zr = zr_binary
    if zr is not None:
        run_json = tmp_path / "run.json"
        run_json.write_text(json.dumps(described.describe()))
        out = subprocess.run([zr, "explain", "--run", str(run_json), "--step", "6", "--json"], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        listed = [json.loads(line) for line in out.stdout.splitlines()]
        assert [e["record"] for e in listed] == [m["record"] for m in described.manifest(6)]
        assert all(e["pieces"] for e in listed), "each packed row's documents listed"
    head, state = run(2, steps=7)  # mid-ramp: a step of 16 taken, two to go
    assert state["samples"] == 6 * 8 + 16 and state["history"] == [[0, 8], [6, 16]]
    tail, _ = run(8, state=state, steps=13)
    for got, want in zip(head + tail, whole):
        np.testing.assert_array_equal(got, want)
    # A schedule changed for steps not taken yet is said; one that rewrites them, refused.
    later = zrecord.RampSampler(len(packed), stages=[(0, 8), (48, 16), (64, 32)], seed=5)
    with pytest.warns(UserWarning, match="changes from step 7"):
        later.load_state_dict(state)
    rewritten = zrecord.RampSampler(len(packed), stages=[(0, 8), (16, 16)], seed=5)
    with pytest.raises(ValueError, match="step 2 was taken with a global batch of 8"):
        rewritten.load_state_dict(state)
    with pytest.raises(ValueError, match="does not divide among 3 ranks"):
        zrecord.RampSampler(len(packed), ranks=3, **ramp)


def test_a_token_weighted_mixture_of_packed_streams_with_budgets(tmp_path):
    rng = np.random.default_rng(21)
    short = _make(tmp_path / "short", [rng.integers(0, 9, size=int(n)).astype(np.uint32) for n in rng.integers(1, 30, 800)])
    long = _make(tmp_path / "long", [rng.integers(0, 9, size=int(n)).astype(np.uint32) for n in rng.integers(20, 300, 300)])
    other = _make(tmp_path / "other", [rng.integers(0, 9, size=int(n)).astype(np.uint32) for n in rng.integers(5, 60, 400)])
    a, b, c = (s.packed(63, lookahead=64) for s in (short, long, other))
    sources = [
        (2.0, zrecord.TokenSource(a, epochs=1)),
        (1.0, [(1.0, zrecord.TokenSource(b, tokens=6000)), (1.0, zrecord.TokenSource(c, epochs=1))]),
    ]
    mixture = zrecord.Mixture.by_tokens(sources, seed=3, batch=8)
    assert mixture.end is not None and mixture.leaves == [a, b, c]
    assert mixture.budgets[0] == len(a) and mixture.budgets[2] == len(c)
    loader = zrecord.Loader(mixture.leaves, mixture)
    count = 0
    for batch in loader:
        count += 1
        tokens, segments = batch["tokens"], batch["segment_ids"]
        assert tokens.shape == (8, 64)
        # cu_seqlens of the mixed batch: each run of a segment in a row's inputs.
        cu = batch["cu_seqlens"]
        assert cu[0] == 0 and cu[-1] == 8 * 63
        for r in range(8):
            inputs = segments[r, :-1]
            runs = 1 + int((inputs[1:] != inputs[:-1]).sum())
            assert ((cu > r * 63) & (cu <= (r + 1) * 63)).sum() == runs
        assert batch["max_seqlen"] == int(np.diff(cu).max())
    assert count == mixture.end
    drawn = mixture.drawn_before(mixture.end)
    for leaf, budget in enumerate(mixture.budgets):
        assert budget <= drawn[leaf] < budget + 8, (leaf, drawn, mixture.budgets)
    # Weighed by tokens: while all three are read, source a gives about twice b's tokens.
    first = mixture.config["stages"][0][1]
    per_token = [w * s.stats()["tokens"] / s.stats()["rows"] for w, s in zip(first, (a, b, c))]
    assert abs(per_token[0] / per_token[1] - 4.0) < 1e-6 and abs(per_token[1] / per_token[2] - 1.0) < 1e-6
    with pytest.raises(TypeError, match="TokenSource or a list"):
        zrecord.Mixture.by_tokens([(1.0, a)])


def test_text_tokenized_by_zr_convert_equals_the_tokenizers_package(tmp_path, zr_binary):
    tokenizers = pytest.importorskip("tokenizers")
    zr = zr_binary
    if zr is None:
        pytest.skip("the zr binary is not built")
    import gzip
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    texts = [
        "The quick brown fox jumps over the lazy dog.",
        "café, naïve, e\u0301 (a combining accent), Ω≈ç√",
        "emoji 🙂👍🏽 and a flag 🇫🇷",
        "",
        "tabs\tand\nnewlines inside the text",
        "numbers 1234567890 and punctuation !?;:",
    ] * 40 + [f"document number {k} " * (k % 7) for k in range(200)]
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=400, special_tokens=["[UNK]", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    half = len(texts) // 2
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t, "url": f"u{k}"}) + "\n" for k, t in enumerate(texts[:half])))
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps({"text": t}) + "\n" for t in texts[half:]))
    dest = tmp_path / "stream"
    done = subprocess.run([zr, "convert", str(dest), "--jsonl", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl.gz"), "--tokenizer", str(path), "--eos", "</s>"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert f"converted {len(texts)} documents" in done.stdout
    stream = zrecord.open_stream(dest)
    assert stream.documents == len(texts) and stream.dtype == np.uint16
    eos = tokenizer.token_to_id("</s>")
    for k, encoding in enumerate(tokenizer.encode_batch(texts, add_special_tokens=False)):
        np.testing.assert_array_equal(stream.document(k), np.array(encoding.ids + [eos], dtype=np.uint16), err_msg=f"document {k}: {texts[k]!r}")
    # The same from Python, natively: the same stream.
    done = zrecord.tokenize_jsonl([tmp_path / "a.jsonl", tmp_path / "b.jsonl.gz"], path, tmp_path / "py", eos="</s>", meta_keys=["url"])
    assert (done["documents"], done["dtype"]) == (len(texts), "<u2")
    for k in (0, 1, half, len(texts) - 1):
        np.testing.assert_array_equal(done["stream"].document(k), stream.document(k))
    # A bad line is named by file and line, and nothing is left behind.
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"text": "fine"}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:3: not JSON"):
        zrecord.tokenize_jsonl(tmp_path / "bad.jsonl", path, tmp_path / "bad_py")
    assert not (tmp_path / "bad_py").exists()
    assert zrecord.tokenize_jsonl(tmp_path / "bad.jsonl", path, tmp_path / "skipped", skip_bad=True)["skipped"] == 1
    failed = subprocess.run([zr, "convert", str(tmp_path / "bad"), "--jsonl", str(tmp_path / "bad.jsonl"), "--tokenizer", str(path)], capture_output=True, text=True)
    assert failed.returncode != 0 and "bad.jsonl:3: not JSON" in failed.stderr, failed.stderr
    assert not (tmp_path / "bad").exists()


def test_a_ramp_over_a_token_mixture_of_packed_streams_resumes_on_other_ranks(tmp_path):
    rng = np.random.default_rng(31)
    a = _make(tmp_path / "a", [rng.integers(0, 9, size=int(n)).astype(np.uint32) for n in rng.integers(1, 40, 500)]).packed(63, lookahead=32)
    b = _make(tmp_path / "b", [rng.integers(0, 9, size=int(n)).astype(np.uint32) for n in rng.integers(30, 200, 300)]).packed(63, lookahead=32)

    def run(ranks, state=None, steps=12):
        mixture = zrecord.Mixture.by_tokens([(1.0, zrecord.TokenSource(a)), (1.0, zrecord.TokenSource(b, epochs=3))], seed=4, batch=1)
        samplers = [zrecord.RampSampler(0, global_batch=16, ramp=(4, 4, 48), rank=r, ranks=ranks, mixture=mixture) for r in range(ranks)]
        loaders = [zrecord.Loader(mixture.leaves, s) for s in samplers]
        if state is not None:
            for loader in loaders:
                loader.load_state_dict(state)
        out = []
        for k, batches in enumerate(zip(*loaders)):
            tokens = np.concatenate([x["tokens"] for x in batches])
            for x in batches:
                assert x["cu_seqlens"][-1] == x["tokens"].shape[0] * 63
            out.append((np.concatenate([x["source"] for x in batches]), tokens))
            if k + 1 == steps:
                break
        return out, loaders[0].state_dict()

    whole, _ = run(1, steps=12)
    assert [s.size for s, _ in whole[:6]] == [4, 4, 4, 4, 8, 8]
    assert {int(x) for s, _ in whole for x in s} == {0, 1}, "both sources read"
    head, state = run(2, steps=5)
    assert "proof" in state, "a ramped checkpoint carries its order proof"
    tail, _ = run(4, state=state, steps=7)
    for (s1, t1), (s2, t2) in zip(head + tail, whole):
        np.testing.assert_array_equal(s1, s2)
        np.testing.assert_array_equal(t1, t2)
    # Each step's manifest names each position's source and that source's epoch: a,
    # which holds about a third of b's tokens, runs through its epochs.
    mixture = zrecord.Mixture.by_tokens([(1.0, zrecord.TokenSource(a)), (1.0, zrecord.TokenSource(b, epochs=3))], seed=4, batch=1)
    loader = zrecord.Loader(mixture.leaves, zrecord.RampSampler(0, global_batch=16, ramp=(4, 4, 48), mixture=mixture))
    for step, (sources, _) in enumerate(whole):
        manifest = loader.manifest(step)
        assert [m["dataset"] for m in manifest] == [loader.describe()["datasets"][int(x)]["name"] for x in sources]
    epochs = [m["epoch"] for step in range(40) for m in loader.manifest(step) if m["dataset"] == "a"]
    assert epochs == sorted(epochs) and epochs[-1] >= 1
