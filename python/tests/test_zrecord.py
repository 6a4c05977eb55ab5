"""The zrecord package from Python: round trips, errors, samplers and the loader's exact
resume, fork safety, framework protocols and a cluster round trip."""

from __future__ import annotations

import json
import multiprocessing
import os
import pathlib
import pickle
import threading

import numpy as np
import pytest

import zrecord
from zrecord.grain import DataSource
from zrecord.testing import LocalCluster
from zrecord.torch import MapDataset, StatefulSampler

DTYPES = ["|u1", "|i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8", "<f2", "<f4", "<f8", "|b1", "<c8"]
SHAPES = [(), (3,), (2, 5), (4, 1, 3)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_every_dtype_and_shape_round_trips(tmp_path, dtype, shape):
    rng = np.random.default_rng(abs(hash((dtype, shape))) % 2**32)
    rows = (rng.random((20, *shape)) * 100).astype(dtype)
    ds = zrecord.from_numpy(rows, tmp_path / "ds")
    (field,) = ds.fields
    assert (field.name, field.dtype, field.shape) == ("data", np.dtype(dtype), shape)
    got = ds.gather([5, 0, 19, 5])["data"]
    assert got.dtype == np.dtype(dtype) and got.shape == (4, *shape)
    np.testing.assert_array_equal(got, rows[[5, 0, 19, 5]])
    np.testing.assert_array_equal(ds[7]["data"], rows[7])


@pytest.mark.parametrize("compress", ["raw", "flate"])
def test_typed_fields_of_either_compression_fill_out(tmp_path, compress):
    rows = np.arange(2000 * 8, dtype="<i4").reshape(2000, 8)
    ds = zrecord.from_numpy(rows, tmp_path / "ds", compress=compress)
    indices = np.random.default_rng(1).integers(0, 2000, size=1500)
    np.testing.assert_array_equal(ds.gather(indices)["data"], rows[indices])
    out = np.empty((1500, 8), dtype="<i4")
    ds.gather(indices, out={"data": out}, checked=True)
    np.testing.assert_array_equal(out, rows[indices])


def test_variable_and_flate_fields(tmp_path):
    ds = zrecord.create(tmp_path / "ds", ["raw", ("text", "flate")])
    records = [{"raw": bytes(range(k % 256)) * (k % 3), "text": f"record {k} " * k} for k in range(200)]
    records[10] = {"raw": b"only raw"}  # a field a record lacks is absent (empty)
    assert ds.append_many(records) == 0
    ds.commit()
    indices = [199, 3, 10, 3, 0]
    batch = ds.gather(indices)
    for name in ("raw", "text"):
        values, offsets = batch[name]
        assert values.dtype == np.uint8 and offsets.dtype == np.int64 and offsets.size == len(indices) + 1
        for k, i in enumerate(indices):
            want = records[i].get(name, b"")
            want = want.encode() if isinstance(want, str) else want
            assert values[offsets[k] : offsets[k + 1]].tobytes() == want
    assert ds[10] == {"raw": b"only raw", "text": b""}
    only = ds.gather(np.array([1, 2], dtype=np.int32), fields=["text"])
    assert list(only) == ["text"]


def test_indices_out_of_range_and_negative(tmp_path):
    ds = zrecord.from_numpy(np.arange(10, dtype="<i8"), tmp_path / "ds")
    np.testing.assert_array_equal(ds.gather([-1, -10])["data"], [9, 0])
    with pytest.raises(IndexError, match="index 10 is out of range"):
        ds.gather([10])
    with pytest.raises(IndexError):
        ds.gather([-11])
    with pytest.raises(IndexError):
        ds[10]
    with pytest.raises(KeyError, match="nope"):
        ds.gather([0], fields=["nope"])
    with pytest.raises(TypeError):
        ds.gather([0.5])


def test_out_fills_caller_memory(tmp_path):
    rows = np.arange(64 * 16, dtype="<f4").reshape(64, 16)
    ds = zrecord.from_numpy(rows, tmp_path / "ds")
    out = np.zeros((3, 16), dtype="<f4")
    got = ds.gather([63, 1, 2], out={"data": out})["data"]
    assert got is out
    np.testing.assert_array_equal(out, rows[[63, 1, 2]])
    raw = bytearray(3 * 16 * 4)
    ds.gather([4, 5, 6], out={"data": raw})
    np.testing.assert_array_equal(np.frombuffer(raw, dtype="<f4").reshape(3, 16), rows[4:7])
    with pytest.raises(ValueError, match=r"gathers 2 records into float32\[2, 16\]"):
        ds.gather([1, 2], out={"data": np.zeros((3, 16), dtype="<f4")})
    with pytest.raises(ValueError, match="writable"):
        ds.gather([1], out={"data": bytes(64)})


def test_errors_are_python_exceptions(tmp_path):
    with pytest.raises(FileNotFoundError):
        zrecord.open(tmp_path / "missing")
    ds = zrecord.from_numpy(np.arange(100, dtype="<u8"), tmp_path / "ds")
    writer = zrecord.open(tmp_path / "ds", writable=True)  # beside a reader
    with pytest.raises(zrecord.Error, match="one writer at a time"):
        zrecord.open(tmp_path / "ds", writable=True)
    writer.close()
    with pytest.raises(KeyError):
        ds.append({"other": b"x"})
    del ds
    # A damaged payload: a checked gather raises CorruptRecord, never a wrong value.
    for chunk in (tmp_path / "ds" / "chunk").iterdir():
        data = bytearray(chunk.read_bytes())
        at = data.find(np.uint64(42).tobytes())
        if at >= 0:
            data[at] ^= 0xFF
            chunk.write_bytes(bytes(data))
    ds = zrecord.open(tmp_path / "ds")
    with pytest.raises(zrecord.CorruptRecord, match="record 42"):
        ds.gather([41, 42], checked=True)
    assert ds.gather([41], checked=True)["data"].tolist() == [41]


def test_writes_modify_delete_and_reads_during_appends(tmp_path):
    ds = zrecord.create(tmp_path / "ds", [("x", "raw", "<i8", ())])
    ds.append_many([{"x": np.int64(k)} for k in range(100)])
    ds.commit()
    ds.modify(5, {"x": np.int64(-5)})
    ds.delete(0)  # the last record (99) takes index 0
    assert len(ds) == 99
    assert ds.gather([0, 5])["x"].tolist() == [99, -5]
    # Appends on one thread while another gathers what is there.
    stop = threading.Event()
    errors = []

    def append():
        k = 1000
        while not stop.is_set() and k < 3000:
            ds.append_many([{"x": np.int64(k + j)} for j in range(50)])
            k += 50

    writer = threading.Thread(target=append)
    writer.start()
    try:
        for _ in range(200):
            n = len(ds)
            got = ds.gather(np.arange(min(n, 99)))["x"]
            if got[5] != -5:
                errors.append(got[5])
    finally:
        stop.set()
        writer.join()
    assert not errors
    assert len(ds) > 99


def test_sampler_shards_ranks_and_resumes(tmp_path):
    full = zrecord.Sampler(1000, order="shuffle", seed=3, batch=32, drop_last=True)
    seen = np.concatenate(list(full))
    assert len(set(seen.tolist())) == seen.size == 992  # drop_last: 31 whole batches
    # PyTorch's default: the last, partial batch kept.
    kept = list(zrecord.Sampler(1000, order="shuffle", seed=3, batch=32))
    assert len(kept) == 32 and kept[-1].size == 8
    assert sorted(np.concatenate(kept).tolist()) == list(range(1000))
    # A split across ranks that must leave records out says so.
    with pytest.warns(UserWarning, match="2 of 1002 records are left out of each epoch"):
        uneven = zrecord.Sampler(1002, rank=0, ranks=4, batch=10)
    assert uneven.left_out == 2
    ranks = [zrecord.Sampler(1000, order="shuffle", seed=3, rank=r, ranks=4, batch=10) for r in range(4)]
    per_rank = [np.concatenate(list(s)) for s in ranks]
    assert len({len(p) for p in per_rank}) == 1
    assert not set(per_rank[0].tolist()) & set(per_rank[1].tolist())
    # Stopped after 7 batches, resumed from its state: the same rest.
    a = zrecord.Sampler(1000, order="shuffle", seed=9, batch=16)
    it = iter(a)
    for _ in range(7):
        next(it)
    state = a.state_dict()
    rest = [b.tolist() for b in it]
    b = zrecord.Sampler(1000, order="shuffle", seed=9, batch=16)
    b.load_state_dict(state)
    assert [x.tolist() for x in b] == rest
    with pytest.raises(ValueError):
        zrecord.Sampler(999, order="shuffle", seed=9, batch=16).load_state_dict(state)
    a.set_epoch(1)
    assert next(iter(a)).tolist() != next(iter(zrecord.Sampler(1000, order="shuffle", seed=9, batch=16))).tolist()


def test_loader_resume_equals_an_uninterrupted_run(tmp_path):
    rows = np.arange(3000, dtype="<u4")
    ds = zrecord.from_numpy(rows, tmp_path / "ds")
    whole = [b["data"].tolist() for b in zrecord.Loader(ds, zrecord.Sampler(len(ds), seed=5, batch=64), prefetch=4, workers=3)]
    loader = zrecord.Loader(ds, zrecord.Sampler(len(ds), seed=5, batch=64), prefetch=4, workers=3)
    first = []
    for k, batch in enumerate(loader):
        first.append(batch["data"].tolist())
        if k == 9:
            break  # prefetched batches are in flight here
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    resumed = zrecord.Loader(ds, zrecord.Sampler(len(ds), seed=5, batch=64), prefetch=4, workers=3)
    resumed.load_state_dict(state)
    rest = [b["data"].tolist() for b in resumed]
    assert first + rest == whole
    flat = sum(whole, [])
    assert len(set(flat)) == len(flat) == 3000


def _child_sum(ds) -> int:
    # In a forked child: the dataset reopens itself in this process.
    return int(sum(ds.gather(np.arange(len(ds)))["data"].sum() for _ in range(3)))


def test_fork_safe_workers(tmp_path):
    rows = np.arange(5000, dtype="<u8")
    ds = zrecord.from_numpy(rows, tmp_path / "ds")
    # Use the thread pools in the parent first: a fork must not inherit them.
    ds.gather(np.arange(len(ds)))
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(3) as pool:
        sums = pool.map(_child_sum, [ds] * 6)
    assert sums == [3 * int(rows.sum())] * 6
    # A forking multi-worker loader run to completion, as PyTorch's DataLoader does it: the
    # workers (forked after the parent used the dataset) each gather whole batches through
    # the map dataset's __getitems__, in the stateful sampler's order.
    mapped = MapDataset(ds)
    batches = list(StatefulSampler(zrecord.Sampler(len(ds), seed=4, batch=100)))
    with ctx.Pool(2) as pool:
        got = pool.map(mapped.__getitems__, batches)
    assert [[r["data"].item() for r in batch] for batch in got] == batches
    assert sorted(sum(batches, [])) == list(range(5000))


def test_framework_protocols_without_the_frameworks(tmp_path):
    ds = zrecord.from_numpy(np.arange(100, dtype="<i4").reshape(50, 2), tmp_path / "ds")
    mapped = MapDataset(ds)
    assert len(mapped) == 50 and mapped[3]["data"].tolist() == [6, 7]
    assert [r["data"].tolist() for r in mapped.__getitems__([0, 49])] == [[0, 1], [98, 99]]
    source = DataSource(ds)
    assert len(source) == 50 and source._getitems([1])[0]["data"].tolist() == [2, 3]
    sampler = StatefulSampler(zrecord.Sampler(50, seed=1, batch=8))
    it = iter(sampler)
    next(it)
    state = sampler.state_dict()
    rest = list(it)
    again = StatefulSampler(zrecord.Sampler(50, seed=1, batch=8))
    again.load_state_dict(state)
    assert list(again) == rest
    array = np.asarray(ds.gather([1, 2])["data"])
    assert np.from_dlpack(array).tolist() == [[2, 3], [4, 5]]


def test_cluster_round_trip():
    with LocalCluster(3, [("img", "raw"), ("cap", "flate")], replicas=2) as cluster:
        ds = zrecord.connect(cluster.router, cluster.certs)
        records = [{"img": bytes([k % 256]) * (k % 50), "cap": f"caption {k}"} for k in range(500)]
        assert ds.append_many(records) == 0
        ds.commit()
        assert len(ds) == 500
        batch = ds.gather([499, 7, 7, 0])
        values, offsets = batch["cap"]
        assert [values[offsets[k] : offsets[k + 1]].tobytes() for k in range(4)] == [b"caption 499", b"caption 7", b"caption 7", b"caption 0"]
        ds.modify(7, {"img": b"new", "cap": "changed"})
        assert ds[7] == {"img": b"new", "cap": b"changed"}
        ds.delete(0)
        assert len(ds) == 499 and ds[0]["cap"] == b"caption 499"
        with pytest.raises(IndexError):
            ds.gather([10_000])
        # It pickles as the router and certificates.
        again = pickle.loads(pickle.dumps(ds))
        assert len(again) == 499
        # A reader reads and may not write; the refusal names the role needed.
        reader = zrecord.connect(cluster.router, cluster.certs, role="reader")
        assert len(reader) == 499 and reader[0]["cap"] == b"caption 499"
        with pytest.raises(zrecord.Error, match="needs the writer role"):
            reader.append_many([{"img": b"x", "cap": "y"}])
        assert len(pickle.loads(pickle.dumps(reader))) == 499
        with pytest.raises(ValueError, match="reader"):
            zrecord.connect(cluster.router, cluster.certs, role="node")


def test_cluster_gathers_one_hop_or_through_the_router():
    with LocalCluster(2, [("x", "raw")], replicas=2) as cluster:
        ds = zrecord.connect(cluster.router, cluster.certs)
        ds.append_many([{"x": f"record {k}".encode()} for k in range(300)])
        ds.commit()
        routed = zrecord.connect(cluster.router, cluster.certs, role="reader", direct=False)
        assert ds.reads_direct and not routed.reads_direct
        indices = [299, 0, 17, 17, 150]
        for reader in (ds, routed):
            values, offsets = reader.gather(indices)["x"]
            assert [values[offsets[k] : offsets[k + 1]].tobytes() for k in range(5)] == [f"record {i}".encode() for i in indices]
        # Each pickles as it was asked to read.
        assert not pickle.loads(pickle.dumps(routed)).reads_direct
        assert pickle.loads(pickle.dumps(ds)).reads_direct
        assert not routed.dataset("default").reads_direct
        with pytest.raises(IndexError):
            ds.gather([300])


def test_cluster_datasets_by_name():
    with LocalCluster(2, [("img", "raw")], replicas=1) as cluster:
        admin = zrecord.connect(cluster.router, cluster.certs, role="operator")
        text = admin.create_dataset("text", [("tokens", "raw", "<u4", [4]), ("doc", "flate")])
        text.append_many([{"tokens": np.arange(4, dtype=np.uint32) + k, "doc": f"doc {k}"} for k in range(50)])
        text.commit()
        assert [d["name"] for d in admin.datasets()] == ["default", "text"]
        assert admin.datasets()[1]["records"] == 50
        # A writer opens it by name; it pickles with its name.
        writer = zrecord.connect(cluster.router, cluster.certs, dataset="text")
        assert len(writer) == 50 and len(admin) == 0
        assert writer.gather([3])["tokens"].tolist() == [[3, 4, 5, 6]]
        assert len(pickle.loads(pickle.dumps(writer))) == 50
        # A field grown later, written for a range.
        text.add_field("reward", "flate")
        writer.write_field("reward", 10, [f"r{k}".encode() for k in range(10, 20)])
        writer.commit()
        grown = zrecord.connect(cluster.router, cluster.certs, dataset="text")
        values, offsets = grown.gather([9, 10, 19])["reward"]
        assert [values[offsets[k] : offsets[k + 1]].tobytes() for k in range(3)] == [b"", b"r10", b"r19"]
        # A consumer waits for what is not committed yet, up to its limit.
        with pytest.raises(IndexError, match="waited"):
            grown.gather([50], wait_ms=100)
        assert grown.wait_len(50, 1000) == 50
        admin.drop_dataset("text")
        with pytest.raises(zrecord.Error, match="dropped"):
            grown.gather([0])
        with pytest.raises(zrecord.Error):
            zrecord.connect(cluster.router, cluster.certs, dataset="text")


def test_local_field_growth(tmp_path):
    ds = zrecord.create(tmp_path / "ds", ["x"])
    ds.append_many([{"x": bytes([k])} for k in range(20)])
    ds.add_field("label", "flate")
    ds.write_field("label", 5, [b"five", b"six"])
    ds.commit()
    del ds  # the writer keeps the dataset to itself
    again = zrecord.open(tmp_path / "ds")
    assert again[5] == {"x": b"\x05", "label": b"five"} and again[7]["label"] == b""


def test_from_arrays(tmp_path):
    values = np.frombuffer(b"abcdefghij", dtype=np.uint8)
    offsets = np.array([0, 3, 3, 10])
    ds = zrecord.from_arrays(values, offsets, tmp_path / "ds")
    assert len(ds) == 3
    vals, offs = ds.gather([2, 0, 1])["data"]
    assert [vals[offs[k] : offs[k + 1]].tobytes() for k in range(3)] == [b"defghij", b"abc", b""]
    with pytest.raises(ValueError, match="offsets"):
        zrecord.from_arrays(values, np.array([0, 5, 3]), tmp_path / "bad")


def test_zero_copy_record_views(tmp_path):
    rows = np.arange(40, dtype="<f8").reshape(10, 4)
    ds = zrecord.from_numpy(rows, tmp_path / "ds")
    view = ds.view(3, "data")
    np.testing.assert_array_equal(view, rows[3])
    assert not view.flags.writeable and not view.flags.owndata
    with pytest.raises(ValueError):
        view[0] = 1.0
    last = ds.view(-1, "data")
    del ds  # the views keep their mapping alive
    np.testing.assert_array_equal(last, rows[9])
    np.testing.assert_array_equal(view, rows[3])
    with pytest.raises(IndexError):
        zrecord.open(tmp_path / "ds").view(10, "data")


def _read_only_mount(source, target) -> bool:
    """Bind-mounts ``source`` read-only at ``target`` (root only); False if not allowed."""
    import subprocess

    target.mkdir()
    bind = subprocess.run(["mount", "--bind", str(source), str(target)], capture_output=True)
    if bind.returncode != 0:
        return False
    remount = subprocess.run(["mount", "-o", "remount,ro,bind", str(target)], capture_output=True)
    if remount.returncode != 0:
        subprocess.run(["umount", str(target)])
        return False
    return True


@pytest.mark.parametrize("lock_file", [True, False])
def test_a_dataset_on_a_read_only_directory_opens(tmp_path, lock_file):
    rows = np.arange(30, dtype="<u2").reshape(10, 3)
    zrecord.from_numpy(rows, tmp_path / "ds")
    if not lock_file:
        (tmp_path / "ds" / "lock").unlink()
    mounted = tmp_path / "ro"
    if not _read_only_mount(tmp_path / "ds", mounted):
        pytest.skip("read-only bind mounts need root and mount permission")
    try:
        a, b = zrecord.open(mounted), zrecord.open(mounted)  # readers share it
        np.testing.assert_array_equal(a.gather([9, 0])["data"], rows[[9, 0]])
        assert len(b) == 10
        with pytest.raises((zrecord.Error, OSError)):
            zrecord.open(mounted, writable=True)
        del a, b
    finally:
        import subprocess

        subprocess.run(["umount", str(mounted)], check=True)


def _gather_all(ds) -> list:
    # In a worker process (forked or spawned): every record the dataset holds there.
    return ds.gather(np.arange(len(ds)))["data"].tolist()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_dataset_written_in_a_process_feeds_its_workers(tmp_path, method):
    # create -> append -> commit, the writer still open: workers read the committed records.
    ds = zrecord.create(tmp_path / "ds", [("data", "raw", "<i8", ())])
    ds.append_many([{"data": np.int64(k)} for k in range(300)])
    ds.commit()
    ds.append_many([{"data": np.int64(-1)}])  # not committed: no worker sees it
    with multiprocessing.get_context(method).Pool(2) as pool:
        got = pool.map(_gather_all, [ds] * 4)
    assert got == [list(range(300))] * 4
    ds.close()
    with pytest.raises(ValueError, match="closed"):
        len(ds)
    # Closed, the writer's lock is gone: another writer opens it (and the uncommitted
    # record was never kept).
    with zrecord.open(tmp_path / "ds", writable=True) as again:
        assert len(again) == 300
        again.append({"data": np.int64(300)})
    # Leaving the block committed it.
    assert len(zrecord.open(tmp_path / "ds")) == 301


def _append_and_commit(path, rounds: int) -> None:
    ds = zrecord.open(path, writable=True)
    for r in range(rounds):
        start = len(ds)
        ds.append_many([{"data": np.full(64, start + k, dtype="<u4")} for k in range(37)])
        ds.commit()
    ds.close()


def test_a_reader_process_gathers_while_a_writer_process_appends(tmp_path):
    path = tmp_path / "ds"
    with zrecord.create(path, [("data", "raw", "<u4", (64,))]) as ds:
        ds.append_many([{"data": np.full(64, k, dtype="<u4")} for k in range(37)])
    reader = zrecord.open(path)
    writer = multiprocessing.get_context("spawn").Process(target=_append_and_commit, args=(path, 40))
    writer.start()
    seen = set()
    while writer.is_alive() or len(seen) < 2:
        n = len(reader)  # the last commit, taken at this call
        assert n % 37 == 0, f"a length between commits: {n}"
        rows = reader.gather(np.arange(n))["data"]
        # Every record whole and in place: row k holds k in every element.
        assert (rows == np.arange(n, dtype="<u4")[:, None]).all()
        seen.add(n)
        if not writer.is_alive():
            break
    writer.join()
    assert writer.exitcode == 0
    assert reader.refresh() == 41 * 37
    assert reader.wait_len(41 * 37, timeout_ms=10) == 41 * 37
    with pytest.raises(TimeoutError, match=f"committed {41 * 37}"):
        reader.wait_len(41 * 37 + 1, timeout_ms=20)


def test_modifies_wait_for_readers_elsewhere_and_readers_see_them(tmp_path):
    path = tmp_path / "ds"
    writer = zrecord.create(path, [("data", "raw")])
    writer.append_many([{"data": f"r{k}"} for k in range(10)])
    writer.commit()
    reader = zrecord.open(path)
    assert reader[3]["data"] == b"r3"
    writer.modify(3, {"data": "changed"})
    writer.delete(0)
    writer.commit()
    # A reader takes the commit at its next call: the modify and the delete, whole.
    assert [reader[k]["data"] for k in range(len(reader))] == [b"r9", b"r1", b"r2", b"changed"] + [
        f"r{k}".encode() for k in range(4, 9)
    ]


class _FakeTensor:
    """What ``out=`` uses of a CPU torch tensor, without torch: ``numpy()`` (its memory, no
    copy) and ``is_pinned``."""

    def __init__(self, array):
        self.array = array

    def numpy(self):
        return self.array

    def is_pinned(self):
        return True


def test_out_is_checked_for_keys_dtype_and_shape_and_takes_tensors(tmp_path):
    rows = np.arange(10 * 48, dtype="u1").reshape(10, 48)
    ds = zrecord.create(tmp_path / "ds", [("img", "raw", "u1", (48,)), ("name", "flate")])
    ds.append_many([{"img": r, "name": f"n{k}"} for k, r in enumerate(rows)])
    ds.commit()
    with pytest.raises(ValueError, match=r"float32\[3, 12\]; field 'img' gathers 3 records into uint8\[3, 48\]"):
        ds.gather([0, 1, 2], ["img"], out={"img": np.empty((3, 12), "<f4")})
    with pytest.raises(ValueError, match="uint8"):
        ds.gather([0, 1, 2], ["img"], out={"img": np.empty((3, 48), "i1")})
    with pytest.raises(KeyError, match="'label'"):
        ds.gather([0], ["img"], out={"label": np.empty((1, 48), "u1")})
    with pytest.raises(ValueError, match="varying size"):
        ds.gather([0], ["name"], out={"name": bytearray(8)})
    tensor = _FakeTensor(np.zeros((2, 48), "u1"))
    got = ds.gather([9, 4], ["img"], out={"img": tensor})["img"]
    assert got is tensor
    np.testing.assert_array_equal(tensor.array, rows[[9, 4]])


def test_out_takes_a_pinned_torch_tensor():
    torch = pytest.importorskip("torch")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        rows = np.arange(20 * 8, dtype="<f4").reshape(20, 8)
        ds = zrecord.from_numpy(rows, os.path.join(tmp, "ds"))
        out = torch.empty((3, 8), dtype=torch.float32)
        if torch.cuda.is_available():
            out = out.pin_memory()
        ds.gather([3, 1, 19], out={"data": out})
        np.testing.assert_array_equal(out.numpy(), rows[[3, 1, 19]])


def test_what_newcomers_type_first(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # Paths without a directory part.
    ds = zrecord.from_numpy(np.arange(6, dtype="<i8"), "train")
    assert len(ds) == 6
    with zrecord.create("other", ["x"]) as other:
        other.append({"x": b"1"})
    n = len(ds)
    with pytest.raises(IndexError, match="out of range"):
        ds.view(-n - 1, "data")
    assert ds.view(-1, "data").item() == 5
    # Negative indices of a narrow type (NumPy 2 would overflow adding the length).
    assert ds.gather(np.array([-1, -6], dtype=np.int8))["data"].tolist() == [5, 0]
    with pytest.raises(ValueError, match="one-dimensional"):
        ds.gather(np.zeros((2, 2), dtype=np.int64))
    # A garbage meta.json is named, not a missing file.
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "meta.json").write_text("{not json")
    with pytest.raises(zrecord.Error, match="meta.json"):
        zrecord.open("bad")


class _PrefetchingLoader:
    """What ``torch.utils.data.DataLoader(batch_sampler=..., num_workers=2)`` does with the
    sampler, without torch: takes batches of indices from it ``ahead`` batches before the
    loop gets them (its workers prefetch), and yields them gathered, in order."""

    def __init__(self, dataset, batch_sampler, ahead=4):
        self.dataset, self.batch_sampler, self.ahead = dataset, batch_sampler, ahead

    def __iter__(self):
        taken = []
        for indices in self.batch_sampler:
            taken.append(indices)
            if len(taken) > self.ahead:
                yield self.dataset.__getitems__(taken.pop(0))
        while taken:
            yield self.dataset.__getitems__(taken.pop(0))


def test_a_plain_prefetching_loader_resumes_exactly_through_track(tmp_path):
    from zrecord.torch import Batch, collate_columns

    ds = zrecord.from_numpy(np.arange(1000, dtype="<i8"), tmp_path / "ds")
    mapped = MapDataset(ds)

    def run(sampler, stop_after=None):
        got = []
        for k, batch in enumerate(sampler.track(_PrefetchingLoader(mapped, sampler))):
            assert isinstance(batch, Batch)
            got.append(collate_columns(batch)["data"].tolist())
            if stop_after is not None and k + 1 == stop_after:
                break
        return got

    whole = run(StatefulSampler(zrecord.Sampler(1000, seed=7, batch=64)))
    assert len(whole) == 16 and sorted(sum(whole, [])) == list(range(1000))
    for k in (1, 7, 15):
        sampler = StatefulSampler(zrecord.Sampler(1000, seed=7, batch=64))
        first = run(sampler, stop_after=k)
        # The state after the k batches received, not the k + 4 handed out.
        state = pickle.loads(pickle.dumps(sampler.state_dict()))
        assert (state["epoch"], state["position"], state["global_batches"]) == (0, min(64 * k, 1000), k)
        resumed = StatefulSampler(zrecord.Sampler(1000, seed=7, batch=64))
        resumed.load_state_dict(state)
        assert first + run(resumed) == whole, k
        # Broken off and iterated again, the same sampler goes on after batch k.
        assert first + run(sampler) == whole, k
    # Once an epoch is done the next begins; its batches differ.
    sampler = StatefulSampler(zrecord.Sampler(1000, seed=7, batch=64))
    assert run(sampler) == whole
    assert sampler.state_dict()["epoch"] == 1 and run(sampler) != whole


def test_map_dataset_batches_stay_whole(tmp_path):
    from zrecord.torch import Batch, collate_columns

    rows = np.arange(40 * 3, dtype="<f4").reshape(40, 3)
    ds = zrecord.create(tmp_path / "ds", [("x", "raw", "<f4", (3,)), ("name", "flate")])
    ds.append_many([{"x": r, "name": f"r{k}"} for k, r in enumerate(rows)])
    ds.commit()
    batch = MapDataset(ds).__getitems__([5, 0, 39])
    assert isinstance(batch, Batch) and len(batch) == 3
    # The gathered arrays as they are: no split into records and stack again.
    columns = collate_columns(batch)
    assert columns["x"] is batch.columns["x"]
    np.testing.assert_array_equal(columns["x"], rows[[5, 0, 39]])
    # Per record on demand (what torch's default collate reads).
    assert batch[1]["name"] == b"r0" and batch[-1]["x"].tolist() == rows[39].tolist()
    assert [r["name"] for r in batch] == [b"r5", b"r0", b"r39"]
    with pytest.raises(IndexError):
        batch[3]


def test_grain_batches_arrive_whole_and_resume():
    grain = pytest.importorskip("grain")
    import tempfile

    from zrecord.grain import BatchSource, batches

    with tempfile.TemporaryDirectory() as tmp:
        rows = np.arange(1000 * 4, dtype="<i4").reshape(1000, 4)
        ds = zrecord.from_numpy(rows, os.path.join(tmp, "ds"))
        sampler = zrecord.Sampler(len(ds), seed=3, batch=64)
        source = BatchSource(ds, sampler, epochs=2)
        assert len(source) == 32
        expected = [rows[sampler.batch_at(e, p)] for e in (0, 1) for p in range(0, 1000, 64)]
        it = iter(batches(ds, sampler, epochs=2).to_iter_dataset())
        got = [next(it)["data"] for _ in range(5)]
        state = it.get_state()
        got += [b["data"] for b in it]
        assert len(got) == 32
        for g, e in zip(got, expected):
            np.testing.assert_array_equal(g, e)
        resumed = iter(batches(ds, sampler, epochs=2).to_iter_dataset())
        resumed.set_state(state)
        rest = [b["data"] for b in resumed]
        assert len(rest) == 27
        for g, e in zip(rest, expected[5:]):
            np.testing.assert_array_equal(g, e)
        # Grain's own batch() over the record source still gives the same records.
        by_record = grain.MapDataset.source(DataSource(ds)).batch(10)
        np.testing.assert_array_equal(by_record[1]["data"], rows[10:20])


def test_from_numpy_takes_several_fields(tmp_path):
    images = np.arange(30 * 4 * 4, dtype="u1").reshape(30, 4, 4)
    labels = np.arange(30, dtype="<i8") * 7
    text = [f"caption {k}".encode() * (k % 3) for k in range(30)]
    offsets = np.concatenate([[0], np.cumsum([len(t) for t in text])]).astype(np.int64)
    values = np.frombuffer(b"".join(text), dtype=np.uint8)
    ds = zrecord.from_numpy({"image": images, "label": labels, "text": (values, offsets)}, tmp_path / "ds", compress={"text": "flate"})
    assert [(f.name, f.compress, f.shape) for f in ds.fields] == [("image", "raw", (4, 4)), ("label", "raw", ()), ("text", "flate", None)]
    batch = ds.gather([29, 0, 5])
    np.testing.assert_array_equal(batch["image"], images[[29, 0, 5]])
    assert batch["label"].tolist() == [203, 0, 35]
    got, offs = batch["text"]
    assert [got[offs[k] : offs[k + 1]].tobytes() for k in range(3)] == [text[29], text[0], text[5]]
    with pytest.raises(ValueError, match="has 29 records and the fields before it 30"):
        zrecord.from_numpy({"image": images, "label": labels[:29]}, tmp_path / "bad")


def _global_batches(mixture_args, ranks, per_rank, start, stop, **kw):
    """Global batches start..stop of a mixture read by `ranks` ranks: per batch, the rows of
    every rank in rank order."""
    out = []
    for b in range(start, stop):
        rows = []
        for r in range(ranks):
            m = zrecord.Mixture(*mixture_args, rank=r, ranks=ranks, batch=per_rank, **kw)
            source, index = m.batch_at(b)
            rows += list(zip(source.tolist(), index.tolist()))
        out.append(rows)
    return out


def test_a_mixture_resumes_on_any_number_of_ranks_and_keeps_its_proportions():
    args = ([5000, 800, 120], [0.7, 0.2, 0.1])
    stages = [(30, [0.2, 0.2, 0.6])]
    whole = _global_batches(args, 1, 12, 0, 60, seed=4, stages=stages)
    # 4 ranks for 10 batches, then 2, then 3 (across the stage boundary at 30), then 1;
    # each resumed from the state a rank of the run before took.
    chain, at = [], 0
    for ranks, until in ((4, 10), (2, 25), (3, 41), (1, 60)):
        m = zrecord.Mixture(*args, seed=4, rank=ranks - 1, ranks=ranks, batch=12 // ranks, stages=stages)
        if at:
            m.load_state_dict(state)
        assert m.batches == at
        chain += _global_batches(args, ranks, 12 // ranks, at, until, seed=4, stages=stages)
        m.batches = until
        state = m.state_dict()
        at = until
    assert chain == whole
    # Proportions over 10^5 records within 1% of the weights.
    m = zrecord.Mixture(*args, seed=1, batch=1000)
    sources = np.concatenate([m.batch_at(b)[0] for b in range(100)])
    for i, w in enumerate(args[1]):
        assert abs((sources == i).mean() - w) < 0.01 * w
    assert m.drawn_before(100) == [int((sources == i).sum()) for i in range(3)]
    # Another global batch, other lengths or other weights are refused, naming them.
    with pytest.raises(ValueError, match="global batch .* of 12, this mixture has 10"):
        zrecord.Mixture(*args, seed=4, ranks=2, batch=5, stages=stages).load_state_dict(state)
    with pytest.raises(ValueError, match="dataset lengths"):
        zrecord.Mixture([5000, 800, 121], args[1], seed=4, batch=12, stages=stages).load_state_dict(state)
    with pytest.raises(ValueError, match="weights"):
        zrecord.Mixture(*args, seed=4, batch=12, stages=[(30, [0.3, 0.1, 0.6])]).load_state_dict(state)


def test_a_sampler_state_is_the_same_on_every_rank_and_resumes_under_other_ranks():
    def global_batches(ranks, batch, epoch, start_batch, count):
        out = []
        for j in range(start_batch, start_batch + count):
            rows = set()
            for r in range(ranks):
                s = zrecord.Sampler(1200, seed=8, rank=r, ranks=ranks, batch=batch)
                rows |= set(s.batch_at(epoch, j * batch).tolist())
            out.append(rows)
        return out

    whole = global_batches(1, 12, 0, 0, 100)
    a = [zrecord.Sampler(1200, seed=8, rank=r, ranks=4, batch=3) for r in range(4)]
    for s in a:
        it = iter(s)
        for _ in range(30):
            next(it)
    states = [s.state_dict() for s in a]
    assert all(st == states[0] for st in states)
    b = zrecord.Sampler(1200, seed=8, rank=1, ranks=3, batch=4)
    b.load_state_dict(states[0])
    assert (b.epoch, b.position) == (0, 120)
    assert global_batches(4, 3, 0, 0, 30) + global_batches(3, 4, 0, 30, 70) == whole
    with pytest.raises(ValueError, match="global batch .* of 12; this sampler has 10"):
        zrecord.Sampler(1200, seed=8, rank=0, ranks=2, batch=5).load_state_dict(states[0])


def test_a_loader_over_a_mixture_reads_each_row_from_its_dataset_and_resumes(tmp_path):
    datasets = []
    for i, n in enumerate((400, 90, 30)):
        with zrecord.create(tmp_path / f"d{i}", [("x", "raw", "<i8", ()), ("text", "flate"), (f"only{i}", "raw")]) as ds:
            ds.append_many([{"x": np.int64(1000 * i + k), "text": f"d{i} r{k} " * (k % 4)} for k in range(n)])
        datasets.append(zrecord.open(tmp_path / f"d{i}"))

    def loader(mixture):
        return zrecord.Loader(datasets, mixture, prefetch=3, workers=2, fields=["x", "text"])

    mix = lambda: zrecord.Mixture([400, 90, 30], [0.5, 0.3, 0.2], seed=2, batch=16)  # noqa: E731
    it = iter(loader(mix()))
    whole = [next(it) for _ in range(40)]
    for batch in whole:
        source = batch["source"]
        values, offsets = batch["text"]
        for k, (s, x) in enumerate(zip(source.tolist(), batch["x"].tolist())):
            assert x // 1000 == s
            want = f"d{s} r{x % 1000} " * ((x % 1000) % 4)
            assert values[offsets[k] : offsets[k + 1]].tobytes() == want.encode()
    # Stopped after 9 batches (3 more in flight), resumed from its state.
    first = loader(mix())
    it = iter(first)
    for _ in range(9):
        next(it)
    state = first.state_dict()
    assert state["batches"] == 9
    resumed_mix = mix()
    resumed = loader(resumed_mix)
    resumed.load_state_dict(state)
    it = iter(resumed)
    for expected in whole[9:]:
        got = next(it)
        assert got["x"].tolist() == expected["x"].tolist()
    with pytest.raises(KeyError, match="dataset 0 has no field 'only1'"):
        zrecord.Loader(datasets, mix(), fields=["only1"])
    with pytest.raises(ValueError, match="dataset 1 holds 90 records and the mixture has it at 91"):
        zrecord.Loader(datasets, zrecord.Mixture([400, 91, 30], [1, 1, 1]), fields=["x"])


def test_a_loader_over_a_mixture_of_a_clusters_datasets():
    with LocalCluster(2, [("x", "raw")], replicas=1) as cluster:
        admin = zrecord.connect(cluster.router, cluster.certs, role="operator")
        datasets = []
        for i, n in enumerate((120, 40)):
            ds = admin.create_dataset(f"part{i}", [("x", "raw", "<i8", ())])
            ds.append_many([{"x": np.int64(1000 * i + k)} for k in range(n)])
            ds.commit()
            datasets.append(zrecord.connect(cluster.router, cluster.certs, dataset=f"part{i}"))
        mixture = lambda: zrecord.Mixture([120, 40], [0.5, 0.5], seed=6, batch=10)  # noqa: E731
        it = iter(zrecord.Loader(datasets, mixture(), fields=["x"]))
        whole = [next(it) for _ in range(12)]
        for batch in whole:
            assert (batch["x"] // 1000 == batch["source"]).all()
        m = mixture()
        assert [b["x"].tolist() for b in whole] == [
            [1000 * s + k for s, k in zip(*(a.tolist() for a in m.batch_at(b)))] for b in range(12)
        ]
        # Resumed after 5 batches: the same 7 after.
        first = zrecord.Loader(datasets, mixture(), fields=["x"])
        it = iter(first)
        for _ in range(5):
            next(it)
        resumed = zrecord.Loader(datasets, mixture(), fields=["x"])
        resumed.load_state_dict(first.state_dict())
        it = iter(resumed)
        assert [next(it)["x"].tolist() for _ in range(7)] == [b["x"].tolist() for b in whole[5:]]


def _mixture_parts(tmp_path):
    datasets = []
    for i, n in enumerate((200, 60)):
        with zrecord.create(tmp_path / f"m{i}", [("x", "raw", "<i8", ()), ("text", "flate")]) as ds:
            ds.append_many([{"x": np.int64(1000 * i + k), "text": f"{i}:{k}"} for k in range(n)])
        datasets.append(zrecord.open(tmp_path / f"m{i}"))
    return datasets


def test_a_mixture_through_the_torch_and_grain_protocols(tmp_path):
    from zrecord.torch import MixtureDataset, MixtureSampler

    datasets = _mixture_parts(tmp_path)
    mixture = lambda **kw: zrecord.Mixture([200, 60], [0.6, 0.4], seed=9, batch=8, **kw)  # noqa: E731
    mapped = MixtureDataset(datasets, mixture())

    def run(sampler, stop_after):
        got = []
        for batch in sampler.track(_PrefetchingLoader(mapped, sampler)):
            columns = batch.columns
            assert (columns["x"] // 1000 == columns["source"]).all()
            values, offsets = columns["text"]
            assert [values[offsets[k] : offsets[k + 1]].tobytes().decode() for k in range(8)] == [
                f"{x // 1000}:{x % 1000}" for x in columns["x"].tolist()
            ]
            got.append(columns["x"].tolist())
            if len(got) == stop_after:
                break
        return got

    whole = run(MixtureSampler(mixture()), 20)
    sampler = MixtureSampler(mixture())
    first = run(sampler, 6)
    state = sampler.state_dict()
    assert state["batches"] == 6  # received, not the 10 handed out
    resumed = MixtureSampler(mixture())
    resumed.load_state_dict(state)
    assert first + run(resumed, 14) == whole
    grain = pytest.importorskip("grain")
    from zrecord.grain import MixtureSource

    it = iter(grain.MapDataset.source(MixtureSource(datasets, mixture(), 20)).to_iter_dataset())
    got = [next(it)["x"].tolist() for _ in range(7)]
    checkpoint = it.get_state()
    again = iter(grain.MapDataset.source(MixtureSource(datasets, mixture(), 20)).to_iter_dataset())
    again.set_state(checkpoint)
    assert got + [b["x"].tolist() for b in again] == whole


def test_zstd_fields(tmp_path):
    records = [b"", b"x", os.urandom(3000), b"a caption about a dog on a beach " * 20, bytes(1 << 20)]
    with zrecord.create(tmp_path / "ds", [("a", "zstd"), ("b", "zstd:9")]) as ds:
        ds.append_many([{"a": r, "b": r} for r in records])
    ds = zrecord.open(tmp_path / "ds")
    assert [f.compress for f in ds.fields] == ["zstd", "zstd:9"]
    batch = ds.gather(list(range(len(records)))[::-1])
    for name in ("a", "b"):
        values, offsets = batch[name]
        got = [values[offsets[k] : offsets[k + 1]].tobytes() for k in range(len(records))]
        assert got == records[::-1]
    with pytest.raises(ValueError, match="zstd level '23'"):
        zrecord.create(tmp_path / "bad", [("a", "zstd:23")])


def test_a_trained_dictionary_from_python(tmp_path):
    lines = [f'{{"id": {k}, "caption": "a photo of {k % 13} dogs on a beach", "w": {200 + k % 97}}}'.encode() for k in range(3000)]
    with zrecord.create(tmp_path / "ds", [("j", "zstd")]) as ds:
        ds.append_many([{"j": line} for line in lines])
    report = zrecord.train_dict(tmp_path / "ds", "j", size=16384)
    assert report["samples"] > 1000 and report["bytes"] > 0
    ds = zrecord.open(tmp_path / "ds")
    values, offsets = ds.gather(np.arange(3000))["j"]
    assert [values[offsets[k] : offsets[k + 1]].tobytes() for k in range(3000)] == lines
    with pytest.raises(KeyError, match="'nope'"):
        zrecord.train_dict(tmp_path / "ds", "nope")


def test_a_cluster_dataset_with_a_dictionary_trained_in_python():
    lines = [f'{{"id": {k}, "caption": "a photo of {k % 13} dogs on a beach at {k % 7} pm", "w": {200 + k % 97}}}'.encode() for k in range(3000)]
    dictionary = zrecord.train_dictionary(lines[::3], size=16384)
    assert isinstance(dictionary, bytes) and 0 < len(dictionary) <= 16384
    with pytest.raises(ValueError, match="cannot train a dictionary from 1 records"):
        zrecord.train_dictionary([b"x"])
    with LocalCluster(2, [("img", "raw")], replicas=1) as cluster:
        admin = zrecord.connect(cluster.router, cluster.certs, role="operator")
        with pytest.raises(zrecord.Error, match="for zstd fields"):
            admin.create_dataset("bad", [("j", "raw")], dicts={"j": dictionary})
        ds = admin.create_dataset("captions", [("j", "zstd")], dicts={"j": dictionary})
        ds.append_many([{"j": line} for line in lines] + [{"j": b""}, {"j": os.urandom(2000)}])
        ds.commit()
        reader = zrecord.connect(cluster.router, cluster.certs, role="reader", dataset="captions")
        values, offsets = reader.gather(np.arange(3000))["j"]
        assert [values[offsets[k] : offsets[k + 1]].tobytes() for k in range(3000)] == lines
        assert reader[3000] == {"j": b""}


def test_errors_a_user_can_act_on(tmp_path):
    rows = np.arange(40, dtype=np.uint8).reshape(10, 4)
    ds = zrecord.from_numpy(rows, tmp_path / "ds")
    name = ds.fields[0].name
    # Far past the end: said as any index past the end is, not as a unit's record.
    for index in (10, 2**48, 2**63):
        with pytest.raises(IndexError, match=f"index {index} is out of range: the dataset holds 10 records"):
            ds.gather(np.array([0, index], dtype=np.uint64))
    # A lone name is not read letter by letter.
    with pytest.raises(TypeError, match="list of names"):
        ds.gather([0], fields=name)
    # A state that is no sampler's.
    sampler = zrecord.Sampler(10, seed=1, batch=2)
    with pytest.raises(ValueError, match="not a sampler's state: it lacks seed, epoch"):
        sampler.load_state_dict({})
    ds.close()
    assert "closed" in repr(ds)


def test_grain_worker_processes_take_batches_and_mixtures(tmp_path):
    grain = pytest.importorskip("grain")
    import pickle

    from zrecord.grain import BatchSource, MixtureSource, batches

    rows = np.arange(400 * 4, dtype="<i4").reshape(400, 4)
    ds = zrecord.from_numpy(rows, tmp_path / "ds")
    sampler = zrecord.Sampler(len(ds), seed=5, batch=32)
    sampler.position = 64  # a sampler part-way: its place travels with it
    again = pickle.loads(pickle.dumps(sampler))
    assert (again.epoch, again.position, again.config) == (0, 64, sampler.config)
    np.testing.assert_array_equal(again.batch_at(1, 32), sampler.batch_at(1, 32))
    source = pickle.loads(pickle.dumps(BatchSource(ds, zrecord.Sampler(len(ds), seed=5, batch=32))))
    np.testing.assert_array_equal(source[3]["data"], rows[sampler.batch_at(0, 96)])
    mixture = zrecord.Mixture([400, 400], [1, 3], seed=2, batch=16, stages=[(5, [1, 1])])
    mixture.batches = 3
    copied = pickle.loads(pickle.dumps(mixture))
    assert copied.batches == 3 and copied.state_dict() == mixture.state_dict()
    mixed = pickle.loads(pickle.dumps(MixtureSource([ds, ds], mixture, 4)))
    np.testing.assert_array_equal(mixed[0]["data"], MixtureSource([ds, ds], mixture, 4)[0]["data"])
    # Grain's worker processes, as a user runs them.
    loader = grain.DataLoader(
        data_source=BatchSource(ds, zrecord.Sampler(len(ds), seed=5, batch=32)),
        sampler=grain.samplers.IndexSampler(13, shuffle=False, num_epochs=1),
        worker_count=2,
    )
    got = [b["data"] for b in loader]
    assert len(got) == 13
    for k, batch in enumerate(got):
        np.testing.assert_array_equal(batch, rows[sampler.batch_at(0, 32 * k)])
    prefetched = batches(ds, zrecord.Sampler(len(ds), seed=5, batch=32)).to_iter_dataset().mp_prefetch(grain.MultiprocessingOptions(num_workers=2))
    assert sum(1 for _ in prefetched) == 13


def _token_dataset(path, rng, n=300):
    """A record dataset of token arrays (uint32) of varied lengths, and their masks."""
    docs = [rng.integers(0, 50_000, size=int(rng.integers(1, 400))).astype(np.uint32) for _ in range(n)]
    masks = [(rng.random(d.size) < 0.8).astype(np.uint8) for d in docs]
    def column(parts):
        offsets = np.concatenate([[0], np.cumsum([p.nbytes for p in parts])]).astype(np.int64)
        return np.frombuffer(b"".join(p.tobytes() for p in parts), dtype=np.uint8), offsets
    ds = zrecord.from_numpy({"tokens": column(docs), "mask": column(masks)}, path)
    return ds, docs, masks


def test_token_budget_micro_batches_within_budget_equal_per_rank_and_resumable(tmp_path):
    rng = np.random.default_rng(12)
    ds, docs, masks = _token_dataset(tmp_path / "ds", rng)
    lengths = zrecord.token_lengths(ds, "tokens")
    np.testing.assert_array_equal(lengths, [d.size for d in docs])
    for cost in ("padded", "packed"):
        budgets = [zrecord.TokenBudget(lengths, 1024, rank=r, ranks=4, accumulation=2, cost=cost, lookahead=64, seed=3) for r in range(4)]
        seen = []
        for step in zip(*[iter(b) for b in budgets]):
            for rank_steps in step:
                assert len(rank_steps) == 2, "every rank as many micro-batches"
                for micro in rank_steps:
                    batch = budgets[0].gather(ds, micro, "tokens", mask_field="mask")
                    if cost == "padded":
                        assert batch["tokens"].size <= 1024
                        for k, e in enumerate(micro):
                            n = docs[e].size
                            np.testing.assert_array_equal(batch["tokens"][k, :n], docs[e])
                            np.testing.assert_array_equal(batch["loss_mask"][k, :n], masks[e].astype(bool))
                    else:
                        assert batch["tokens"].size <= 1024
                        cu = batch["cu_seqlens"]
                        for k, e in enumerate(micro):
                            np.testing.assert_array_equal(batch["tokens"][0, cu[k] : cu[k + 1]], docs[e])
                            np.testing.assert_array_equal(batch["positions"][0, cu[k] : cu[k + 1]], np.arange(docs[e].size))
                    seen.extend(int(e) for e in micro)
            if budgets[0].epoch > 0:
                break
        # Every example of the first epoch; the step that crossed into the next epoch may
        # hold some a second time, none a third.
        assert sorted(set(seen)) == list(range(len(docs)))
        assert max(np.bincount(seen)) <= 2
    # A state taken under 4 ranks resumes under 3 from the same micro-batch on.
    whole = zrecord.TokenBudget(lengths, 1024, cost="packed", lookahead=64, seed=3)
    run = [m for step, _ in zip(whole, range(40)) for m in step]
    before = [zrecord.TokenBudget(lengths, 1024, rank=r, ranks=4, cost="packed", lookahead=64, seed=3) for r in range(4)]
    head = []
    for steps in zip(*[iter(b) for b in before]):
        head.extend(m for s in steps for m in s)
        if len(head) >= 8:
            break
    state = before[0].state_dict()
    after = [zrecord.TokenBudget(lengths, 1024, rank=r, ranks=3, cost="packed", lookahead=64, seed=3) for r in range(3)]
    for b in after:
        b.load_state_dict(state)
    tail = []
    for steps in zip(*[iter(b) for b in after]):
        tail.extend(m for s in steps for m in s)
        if len(head) + len(tail) >= len(run):
            break
    for got, want in zip(head + tail, run):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="max_tokens"):
        zrecord.TokenBudget(lengths, 2048, cost="packed", lookahead=64, seed=3).load_state_dict(state)
    with pytest.raises(ValueError, match="example .* tokens, more than the budget of 100"):
        zrecord.TokenBudget(lengths, 100)
    skipping = zrecord.TokenBudget(lengths, 100, too_long="skip")
    assert skipping.skipped == int((lengths > 100).sum())


def test_what_a_step_held_is_computed_and_a_blocklist_changes_only_its_records(tmp_path):
    import json
    import shutil
    import subprocess

    rows = np.arange(512 * 2, dtype="<i8").reshape(512, 2)
    ds = zrecord.from_numpy(rows, tmp_path / "train")
    # What a real loader delivered, step by step, against the manifest of each step.
    sampler = zrecord.Sampler(len(ds), seed=4, batch=16, ranks=2, rank=0, drop_last=True)
    other = zrecord.Sampler(len(ds), seed=4, batch=16, ranks=2, rank=1, drop_last=True)
    loader = zrecord.Loader(ds, sampler)
    for step, (mine, theirs) in enumerate(zip(loader, zrecord.Loader(ds, other))):
        manifest = loader.manifest(step)
        assert [m["record"] for m in manifest if m["rank"] == 0] == (mine["data"][:, 0] // 2).tolist()
        assert [m["record"] for m in manifest if m["rank"] == 1] == (theirs["data"][:, 0] // 2).tolist()
        assert {m["dataset"] for m in manifest} == {"train"}
    # The same from the command line, from the loader's own description.
    run = tmp_path / "run.json"
    run.write_text(json.dumps(loader.describe()))
    zr = shutil.which("zr")
    if zr is not None:  # the zr binary, where it is installed
        out = subprocess.run([zr, "explain", "--run", str(run), "--step", "3", "--json"], capture_output=True, text=True, check=True)
        listed = [json.loads(line) for line in out.stdout.splitlines()]
        assert [(e["rank"], e["record"]) for e in listed] == [(m["rank"], m["record"]) for m in loader.manifest(3)]
    # A blocklist: exactly the positions that read a blocked record change, over an epoch.
    blocked = [5, 77, 300]
    plain = zrecord.Sampler(len(ds), seed=4, batch=16, ranks=2)
    with_list = zrecord.Sampler(len(ds), seed=4, batch=16, ranks=2, blocklist=blocked)
    changed = 0
    for step in range(len(plain)):
        for a, b in zip(plain.manifest(step), with_list.manifest(step)):
            if a["record"] in blocked:
                assert b["record"] not in blocked and b["replaced"] == a["record"]
                changed += 1
            else:
                assert b == a
    assert changed == len(blocked)
    # Added at a resume: accepted, and said.
    state = plain.state_dict()
    with pytest.warns(UserWarning, match="3 records added to the blocklist"):
        with_list.load_state_dict(state)
    with pytest.raises(ValueError, match="which holds 512"):
        zrecord.Sampler(len(ds), blocklist=[512])
    # Skipping steps [a, b): the state of a run that read them.
    skipping = zrecord.Sampler(len(ds), seed=4, batch=16)
    skipping.skip(40)
    reading = zrecord.Sampler(len(ds), seed=4, batch=16)
    for _, _ in zip(range(40), _batches_of(reading)):
        pass
    assert skipping.state_dict() == reading.state_dict()


def _batches_of(sampler):
    while True:
        yield from sampler


def test_a_checkpoints_order_proof_refuses_a_changed_dataset_or_configuration(tmp_path):
    rows = np.arange(300 * 2, dtype="<i8").reshape(300, 2)
    zrecord.from_numpy(rows, tmp_path / "train")
    ds = zrecord.open(tmp_path / "train")
    loader = zrecord.Loader(ds, zrecord.Sampler(len(ds), seed=1, batch=10))
    for k, _ in enumerate(loader):
        if k == 4:
            break
    state = loader.state_dict()
    assert [name for name, _ in state["proof"]["datasets"]] == ["train"]
    # Unchanged: resumes; and on other ranks with the same global batch too.
    zrecord.Loader(ds, zrecord.Sampler(len(ds), seed=1, batch=10)).load_state_dict(state)
    for rank in range(2):
        elastic = zrecord.Loader(ds, zrecord.Sampler(len(ds), seed=1, batch=5, ranks=2, rank=rank))
        elastic.load_state_dict(state)
        assert elastic.sampler.position == 50 // 2
    # Another seed: the order's configuration differs.
    with pytest.raises(ValueError, match="order's configuration"):
        zrecord.Loader(ds, zrecord.Sampler(len(ds), seed=2, batch=10)).load_state_dict(state)
    # One record rewritten since: refused naming the dataset, or resumed when forced.
    with zrecord.open(tmp_path / "train", writable=True) as writer:
        writer.modify(7, {"data": np.array([-1, -1], dtype="<i8")})
    changed = zrecord.open(tmp_path / "train")
    resumed = zrecord.Loader(changed, zrecord.Sampler(len(changed), seed=1, batch=10))
    with pytest.raises(ValueError, match="dataset 'train' changed since the checkpoint"):
        resumed.load_state_dict(state)
    with pytest.warns(UserWarning, match="resumed anyway"):
        resumed.load_state_dict(state, force=True)
    assert resumed.sampler.position == 50


def test_a_cluster_datasets_order_proof_sees_a_record_rewritten():
    with LocalCluster(2, [("x", "raw")], replicas=1) as cluster:
        ds = zrecord.connect(cluster.router, cluster.certs)
        ds.append_many([{"x": f"record {k}".encode()} for k in range(120)])
        ds.commit()
        reader = zrecord.connect(cluster.router, cluster.certs, role="reader")
        loader = zrecord.Loader(reader, zrecord.Sampler(len(reader), seed=3, batch=8))
        for k, _ in enumerate(loader):
            if k == 2:
                break
        state = loader.state_dict()
        [(name, identity)] = state["proof"]["datasets"]
        assert name == "default" and identity is not None
        # A commit of nothing changes nothing; a record rewritten in place (same length) does.
        ds.commit()
        zrecord.Loader(reader, zrecord.Sampler(len(reader), seed=3, batch=8)).load_state_dict(state)
        ds.modify(5, {"x": b"rewritten"})
        ds.commit()
        resumed = zrecord.Loader(reader, zrecord.Sampler(len(reader), seed=3, batch=8))
        with pytest.raises(ValueError, match="dataset 'default' changed since the checkpoint"):
            resumed.load_state_dict(state)


def _arrow_table(pa, n, seed):
    rng = np.random.default_rng(seed)
    blobs = [rng.integers(0, 256, size=int(rng.integers(0, 300)), dtype=np.uint8).tobytes() for _ in range(n)]
    texts = [None if k % 7 == 3 else f"row {k} é🙂" for k in range(n)]
    images = pa.StructArray.from_arrays([pa.array([None if k % 11 == 5 else blobs[k] for k in range(n)], pa.binary()), pa.array([f"{k}.png" for k in range(n)])], ["bytes", "path"])
    vectors = rng.normal(size=(n, 4)).astype(np.float32)
    table = pa.table({
        "blob": pa.array(blobs, pa.large_binary()),
        "text": pa.array(texts, pa.string()),
        "image": images,
        "vec": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), 4),
        "label": pa.array(np.arange(n, dtype=np.int64) * 3),
    })
    want = [{"blob": blobs[k], "text": (texts[k] or "").encode(), "image": b"" if k % 11 == 5 else blobs[k], "vec": vectors[k], "label": 3 * k} for k in range(n)]
    return table, want


def _check_rows(ds, want):
    batch = ds.gather(np.arange(len(want)))
    for name in ("blob", "text", "image"):
        values, offsets = batch[name]
        got = [values[offsets[k] : offsets[k + 1]].tobytes() for k in range(len(want))]
        assert got == [w[name] for w in want], name
    np.testing.assert_array_equal(batch["vec"], np.stack([w["vec"] for w in want]))
    np.testing.assert_array_equal(batch["label"], [w["label"] for w in want])


def test_from_arrow_writes_tables_and_readers_byte_exact_and_typed(tmp_path):
    pa = pytest.importorskip("pyarrow")
    table, want = _arrow_table(pa, 500, 1)
    # Batches of a sliced, many-chunked table: offsets into shared buffers.
    chunked = pa.concat_tables([table.slice(0, 123), table.slice(123, 300), table.slice(423)])
    ds = zrecord.from_arrow(chunked, tmp_path / "t")
    assert len(ds) == 500
    assert [(f.name, f.dtype, f.shape) for f in ds.fields][3:] == [("vec", np.dtype("float32"), (4,)), ("label", np.dtype("int64"), ())]
    _check_rows(ds, want)
    # A reader, and columns picked, appended to a writable dataset.
    reader = pa.RecordBatchReader.from_batches(table.schema, table.to_batches(max_chunksize=64))
    target = zrecord.create(tmp_path / "r", zrecord.arrow_fields(table.select(["label", "text"]).schema))
    zrecord.from_arrow(reader, target, columns=["label", "text"])
    assert len(target) == 500
    np.testing.assert_array_equal(target.gather([0, 499])["label"], [0, 1497])
    # Refusals name the column; nothing is left behind.
    nested = pa.table({"ok": pa.array([b"x"]), "deep": pa.array([[[1]]])})
    with pytest.raises(ValueError, match="column 'deep' is list"):
        zrecord.from_arrow(nested, tmp_path / "bad")
    nulls = pa.table({"n": pa.array([1, None, 3], pa.int32())})
    with pytest.raises(ValueError, match="row 1 of column 'n' is null"):
        zrecord.from_arrow(nulls, tmp_path / "nulls")
    assert not (tmp_path / "nulls").exists()
    with pytest.raises(ValueError, match="no field 'blob'"):
        zrecord.from_arrow(table, target)


def test_from_arrow_takes_a_hugging_face_dataset_and_fills_a_cluster_dataset(tmp_path):
    pa = pytest.importorskip("pyarrow")
    table, want = _arrow_table(pa, 200, 2)
    with LocalCluster(2, [("x", "raw")], replicas=1) as cluster:
        admin = zrecord.connect(cluster.router, cluster.certs, role="operator")
        images = admin.create_dataset("images", zrecord.arrow_fields(table.schema))
        zrecord.from_arrow(table, images)
        assert len(images) == 200
        _check_rows(images, want)
    datasets = pytest.importorskip("datasets")
    hf = datasets.Dataset.from_dict({"text": [f"doc {k}" for k in range(100)], "label": list(range(100))})
    ds = zrecord.from_arrow(hf, tmp_path / "hf")
    assert len(ds) == 100
    values, offsets = ds.gather([42])["text"]
    assert values[offsets[0] : offsets[1]].tobytes() == b"doc 42"
    assert ds.gather([42])["label"].tolist() == [42]


def test_webdataset_shards_convert_byte_exact(tmp_path):
    webdataset = pytest.importorskip("webdataset")
    import shutil
    import subprocess

    zr = shutil.which("zr") or next((str(p) for p in (pathlib.Path(__file__).resolve().parents[2] / "target" / d / "zr" for d in ("debug", "release")) if p.exists()), None)
    if zr is None:
        pytest.skip("the zr binary is not built")
    rng = np.random.default_rng(3)
    samples = []
    for shard in range(3):
        with webdataset.TarWriter(str(tmp_path / f"train-{shard:06d}.tar")) as sink:
            for k in range(50):
                sample = {"__key__": f"s{shard}_{k:04d}", "jpg": rng.integers(0, 256, size=int(rng.integers(0, 5000)), dtype=np.uint8).tobytes(), "cls": str(k % 10).encode(), "json": json.dumps({"k": k}).encode()}
                sink.write(sample)
                samples.append(sample)
    done = subprocess.run([zr, "convert", str(tmp_path / "ds"), "--webdataset", str(tmp_path / "train-{000000..000002}.tar")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    ds = zrecord.open(tmp_path / "ds")
    assert len(ds) == 150 and sorted(f.name for f in ds.fields) == ["cls", "jpg", "json"]
    for k in (0, 49, 50, 149):
        record = ds[k]
        for field in ("jpg", "cls", "json"):
            assert record[field] == samples[k][field], (k, field)


def test_a_parquet_file_written_by_pyarrow_converts_byte_exact_and_typed(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    import shutil
    import subprocess

    zr = shutil.which("zr") or next((str(p) for p in (pathlib.Path(__file__).resolve().parents[2] / "target" / d / "zr" for d in ("debug", "release")) if p.exists()), None)
    if zr is None:
        pytest.skip("the zr binary is not built")
    rng = np.random.default_rng(8)
    n = 300
    images = [rng.integers(0, 256, size=int(rng.integers(1, 3000)), dtype=np.uint8).tobytes() for _ in range(n)]
    table = pa.table({
        "image": pa.array([{"bytes": b, "path": f"img{k}.png"} for k, b in enumerate(images)], type=pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
        "caption": pa.array([f"a caption é 🙂 {k}" for k in range(n)]),
        "blob": pa.array([None if k % 7 == 0 else bytes([k % 256]) * (k % 50) for k in range(n)], type=pa.binary()),
        "embedding": pa.array(rng.random((n, 4)).astype(np.float32).tolist(), type=pa.list_(pa.float32(), 4)),
        "label": pa.array(np.arange(n, dtype=np.int64) * 3),
    })
    pq.write_table(table, tmp_path / "part-0.parquet", row_group_size=64, compression="snappy")
    pq.write_table(table, tmp_path / "part-1.parquet", compression="zstd")
    done = subprocess.run([zr, "convert", str(tmp_path / "ds"), "--parquet", str(tmp_path / "part-0.parquet"), str(tmp_path / "part-1.parquet")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    ds = zrecord.open(tmp_path / "ds")
    assert len(ds) == 2 * n
    fields = {f.name: f for f in ds.fields}
    assert fields["embedding"].dtype == np.float32 and fields["embedding"].shape == (4,)
    assert fields["label"].dtype == np.int64
    batch = ds.gather(np.arange(2 * n))
    np.testing.assert_array_equal(batch["embedding"][:n], table.column("embedding").to_numpy(zero_copy_only=False).tolist())
    np.testing.assert_array_equal(batch["label"][n:], np.arange(n) * 3)
    for k in (0, 7, 123, 299):
        record = ds[n + k]
        assert record["image"] == images[k]
        assert record["caption"] == f"a caption é 🙂 {k}".encode()
        assert record["blob"] == (b"" if k % 7 == 0 else bytes([k % 256]) * (k % 50))
    # A type we do not take is refused by name, and nothing is left.
    pq.write_table(pa.table({"nested": pa.array([[1, 2], [3]])}), tmp_path / "bad.parquet")
    failed = subprocess.run([zr, "convert", str(tmp_path / "bad"), "--parquet", str(tmp_path / "bad.parquet")], capture_output=True, text=True)
    assert failed.returncode != 0 and "column 'nested' is List" in failed.stderr, failed.stderr
    assert not (tmp_path / "bad").exists()
