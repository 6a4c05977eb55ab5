"""zrecord: random batch reads of byte records at memory speed.

Local datasets (``zrecord.open``, ``zrecord.create``) and clusters (``zrecord.connect``) share
one API: ``len(ds)``, ``ds.fields``, ``ds[i]``, ``ds.gather(indices, fields=None, out=None)``,
and writes (``append``, ``append_many``, ``modify``, ``delete``, ``commit``). A field with a
dtype and shape gathers into a NumPy array of shape ``(B, *shape)``; any other field into
``(values: uint8[...], offsets: int64[B + 1])``. Gathers release the GIL and copy each record
once, straight into its destination.

Token streams (``zrecord.create_stream``, ``zrecord.open_stream``; see ``zrecord.stream``)
hold LLM pre-training tokens with their document boundaries; ``stream.windows(seq_len)`` is
a dataset of windows computed at read time.

Samplers (``zrecord.Sampler``) and a prefetching loader (``zrecord.Loader``) resume exactly
from ``state_dict()``. ``zrecord.torch``, ``zrecord.grain`` and ``zrecord.jax`` adapt them to
those frameworks without depending on them.

Datasets and clients are fork-safe: they pickle as their path (or router and certificates)
and reopen themselves in a child process, so a forking ``DataLoader`` works.

A local dataset has one writer at a time and any number of readers beside it, in any
processes. A reader sees the dataset as of a commit, never a record in part: the last one
when it opened, and the last one again at ``len()``, ``refresh()`` or a gather of an index
past the length it has (so records committed since appear when asked for); records modified
or deleted meanwhile change under no gather. ``close()`` (or ``with``) lets
a dataset go; leaving a ``with`` block of a writable dataset without an error commits it.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from . import _zrecord
from ._zrecord import CorruptRecord, Error

__all__ = [
    "CorruptRecord",
    "Dataset",
    "Error",
    "Field",
    "Loader",
    "Mixture",
    "RampSampler",
    "Sampler",
    "connect",
    "create",
    "arrow_fields",
    "from_arrays",
    "from_arrow",
    "from_numpy",
    "open",
    "Stream",
    "TokenBudget",
    "TokenSource",
    "token_lengths",
    "tokenize_jsonl",
    "Windows",
    "Packed",
    "create_stream",
    "open_stream",
    "train_dict",
    "train_dictionary",
]


@dataclass(frozen=True)
class Field:
    """A field of the dataset: its name, compression, and (for typed fields) dtype and
    per-record shape."""

    name: str
    compress: str
    dtype: np.dtype | None
    shape: tuple[int, ...] | None

    @property
    def fixed(self) -> bool:
        """True if every record of the field has the same size (a dtype and a shape)."""
        return self.dtype is not None and self.shape is not None

    @property
    def record_bytes(self) -> int | None:
        if not self.fixed:
            return None
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def _field(t: tuple) -> Field:
    name, compress, dtype, shape = t
    return Field(
        name,
        compress,
        np.dtype(dtype) if dtype is not None else None,
        tuple(int(s) for s in shape) if shape is not None else None,
    )


def _as_indices(indices: Any) -> np.ndarray:
    """Any integer sequence or array as a uint64 array; negative indices count from the end
    only when the caller's length is known (see ``Dataset._indices``)."""
    array = np.asarray(indices)
    if array.ndim == 0:
        array = array.reshape(1)
    elif array.ndim != 1:
        raise ValueError(f"indices must be one-dimensional, not of shape {array.shape} (flatten them first if that is meant)")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        if array.dtype == object and all(isinstance(i, (int, np.integer)) for i in array):
            return array.astype(np.int64)
        raise TypeError(f"indices must be integers, not {array.dtype}")
    if array.dtype.kind == "i" and array.dtype.itemsize < 8:
        array = array.astype(np.int64)  # negative ones get the length added
    return array


def _names_of(fields: Any) -> list[str]:
    """Field names given as a sequence; a lone string is refused, not read letter by letter."""
    if isinstance(fields, (str, bytes)):
        raise TypeError(f"fields is a list of names, not the string {fields!r}: write [{fields!r}]")
    return list(fields)


def _to_bytes(value: Any) -> np.ndarray:
    """A record's value (bytes, bytearray, memoryview, NumPy array, str) as its bytes."""
    if isinstance(value, str):
        value = value.encode()
    if isinstance(value, np.ndarray):
        return np.ascontiguousarray(value).view(np.uint8).reshape(-1)
    return np.frombuffer(memoryview(value).cast("B"), dtype=np.uint8)


def _columns(records: Sequence[Mapping[str, Any]], names: Iterable[str]) -> dict:
    """Records as columns: per field, all values back to back and their offsets."""
    columns = {}
    for name in names:
        parts = [_to_bytes(r[name]) if name in r else np.empty(0, np.uint8) for r in records]
        lengths = np.fromiter((p.size for p in parts), dtype=np.int64, count=len(parts))
        offsets = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        values = np.concatenate(parts) if parts else np.empty(0, np.uint8)
        columns[name] = (values.astype(np.uint8, copy=False), offsets)
    return columns


class Dataset:
    """A zrecord dataset: a local directory (``zrecord.open``/``create``) or a cluster
    (``zrecord.connect``). See the package documentation."""

    def __init__(self, opener: tuple, handle: Any = None):
        # How to open it again (after a fork, or when unpickled): (kind, *arguments).
        self._opener = opener
        self._handle = handle
        self._pid = os.getpid() if handle is not None else None
        self._lock = threading.Lock()
        self._fields: list[Field] | None = None
        self._closed = False
        # A local reader's: meta.json as it was when opened (a commit replaces it).
        self._seen = self._meta_signature() if handle is not None else None

    # -- opening, per process --------------------------------------------------------------

    def _native(self, fresh: bool = False) -> Any:
        """The native handle of this process (reopened after a fork: thread pools and
        runtimes do not survive one; and, for a local reader asked for the ``fresh`` one,
        after a commit elsewhere)."""
        if self._closed:
            raise ValueError("the dataset is closed")
        pid = os.getpid()
        if self._handle is None or self._pid != pid or (fresh and self._committed_since()):
            with self._lock:
                if self._handle is None or self._pid != pid or (fresh and self._committed_since()):
                    kind, *args = self._opener
                    if kind == "local" and self._pid is not None and self._pid != pid:
                        # A forked child of the process holding it: it reads (the parent
                        # keeps the writer's lock; a writer's handle is never shared).
                        self._opener = ("local", args[0], False)
                        kind, *args = self._opener
                    if kind == "local":
                        path, writable = args
                        seen = self._meta_signature()
                        self._handle = _zrecord.Store.open(path, writable)
                        self._seen = seen
                        self._fields = None
                    else:
                        router, certs, timeout_ms, role, dataset, direct = (list(args) + [None, True])[:6]
                        self._handle = _zrecord.Client.connect(router, certs, timeout_ms, role, dataset, direct)
                    self._pid = pid
        return self._handle

    def _meta_signature(self) -> tuple | None:
        """A local reader's view of meta.json (which each commit replaces): None for a
        writer or a cluster, or if it cannot be read (the open says why)."""
        kind, *args = self._opener
        if kind != "local" or args[1]:
            return None
        try:
            st = os.stat(os.path.join(args[0], "meta.json"))
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _committed_since(self) -> bool:
        return self._seen is not None and self._meta_signature() != self._seen

    def refresh(self) -> int:
        """A local reader: takes the last commit of the dataset now (``len()`` does too, and
        a gather of an index past the length it has); returns the length."""
        return len(self)

    def close(self) -> None:
        """Lets the dataset go: a writer's lock (writes not committed are lost) or a
        cluster's connection. Calls after it raise ``ValueError``."""
        with self._lock:
            self._handle = None
            self._closed = True

    def __enter__(self) -> "Dataset":
        return self

    def __exit__(self, kind, value, traceback) -> None:
        try:
            if kind is None and not self._closed and self._opener[0] == "local" and self._opener[2]:
                self.commit()
        finally:
            self.close()

    def __getstate__(self) -> dict:
        # Reopened read-only: a child process reads (a writer keeps the dataset to itself).
        opener = self._opener
        if opener[0] == "local":
            opener = ("local", opener[1], False)
        return {"opener": opener}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["opener"])

    def __repr__(self) -> str:
        kind, first, *rest = self._opener
        where = str(first)
        if kind == "cluster":
            where = f"router {first}, dataset {(rest[3:] or [None])[0] or 'default'}"
        if self._closed:
            return f"<zrecord.Dataset {where}: closed>"
        return f"<zrecord.Dataset {where}: {len(self)} records, fields {[f.name for f in self.fields]}>"

    # -- reading ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._native(fresh=True))

    @property
    def fields(self) -> list[Field]:
        """The fields: name, compression, dtype and shape."""
        if self._fields is None:
            self._fields = [_field(t) for t in self._native().fields()]
        return self._fields

    def _field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"unknown field '{name}' (the dataset has: {', '.join(f.name for f in self.fields)})")

    def _indices(self, indices: Any) -> np.ndarray:
        array = _as_indices(indices)
        if array.size and array.dtype.kind == "i" and (array < 0).any():
            n = len(self)
            array = np.where(array < 0, array + n, array)
            if (array < 0).any():
                bad = int(array[array < 0][0]) - n
                raise IndexError(f"index {bad} is out of range: the dataset holds {n} records")
        return array.astype(np.uint64, copy=False)

    def gather(self, indices: Any, fields: Sequence[str] | None = None, out: Mapping[str, Any] | None = None, checked: bool = False, wait_ms: int = 0) -> dict:
        """Records ``indices`` (any integers; negative ones count from the end; repeats
        allowed) of ``fields`` (default: all). Per field: an array of shape ``(B, *shape)``
        with the field's dtype (fields with a dtype and shape), else ``(values, offsets)``.
        ``out`` maps fields to caller-owned destinations (NumPy arrays or anything with the
        buffer protocol, C-contiguous, of the right size) filled with no extra copy.
        ``checked``: each record is read against its CRC (a damaged one raises
        ``CorruptRecord``; from a cluster with replicas, a partner's copy is read instead).
        ``wait_ms`` (a cluster's): records not committed yet are waited for, this long at
        most, instead of raising at once (a consumer of what a producer appends)."""
        idx = self._indices(indices)
        names = [f.name for f in self.fields] if fields is None else _names_of(fields)
        chosen = [self._field(n) for n in names]
        given = {}
        if out is not None:
            given = dict(out)
            out = _check_out(out, chosen, idx.size)
        native = self._native()
        if isinstance(native, _zrecord.Store):
            try:
                try:
                    return self._gather_local(native, idx, chosen, out, given, checked)
                except IndexError:
                    if not self._committed_since():
                        raise
                    # Committed since this reader opened: the records asked for may be there now.
                    return self._gather_local(self._native(fresh=True), idx, chosen, out, given, checked)
            except IndexError:
                n = len(self._native())
                past = idx[idx >= n]
                if past.size:
                    raise IndexError(f"index {int(past[0])} is out of range: the dataset holds {n} records") from None
                raise
        result = {}
        columns = native.gather_columns(idx, names, checked, int(wait_ms))
        for f, (values, offsets) in zip(chosen, columns):
            if f.fixed:
                typed = _typed(values, f, idx.size)
                if out is not None and out.get(f.name) is not None:
                    _writable_bytes(out[f.name])[:] = values
                    result[f.name] = given[f.name]
                else:
                    result[f.name] = typed
            else:
                result[f.name] = (values, offsets)
        return result

    def _gather_local(self, native: Any, idx: np.ndarray, chosen: list[Field], out: dict | None, given: dict, checked: bool) -> dict:
        result = {}
        for f in chosen:
            if f.fixed:
                dest = out.get(f.name) if out is not None else None
                if dest is None:
                    dest = np.empty((idx.size, *f.shape), dtype=f.dtype)
                flat = _writable_bytes(dest)
                native.gather_into(idx, f.name, flat, checked)
                if given.get(f.name) is not None:
                    result[f.name] = given[f.name]  # the caller's own object (a tensor stays one)
                else:
                    result[f.name] = dest if isinstance(dest, np.ndarray) else _typed(flat, f, idx.size)
            else:
                result[f.name] = native.gather_columns(idx, f.name, checked)
        return result

    def __getitem__(self, index: int) -> dict:
        """Record ``index`` as {field: value}: an array of the field's dtype and shape, or
        its bytes."""
        if not isinstance(index, (int, np.integer)):
            raise TypeError(f"dataset indices are integers, not {type(index).__name__}")
        batch = self.gather([int(index)])
        record = {}
        for f in self.fields:
            value = batch[f.name]
            record[f.name] = value[0] if f.fixed else value[0].tobytes()
        return record

    def view(self, index: int, field: str) -> np.ndarray:
        """Field ``field`` of record ``index`` with no copy: a read-only array over the
        mapped data (typed by the field's dtype and shape, else uint8). It keeps what it
        views alive, even after the dataset is closed. Local datasets only."""
        native = self._native()
        if not isinstance(native, _zrecord.Store):
            raise TypeError("zero-copy views are of local datasets; gather from a cluster")
        f = self._field(field)
        n = len(self)
        i = int(index) + n if int(index) < 0 else int(index)
        if not 0 <= i < n:
            raise IndexError(f"index {int(index)} is out of range: the dataset holds {n} records")
        raw = native.record_view(i, field)
        if f.fixed:
            return raw.view(f.dtype).reshape(f.shape)
        return raw

    def __getitems__(self, indices: Sequence[int]) -> list[dict]:
        """Records ``indices`` as a list of {field: value}: one gather for the batch."""
        count = _as_indices(indices).size
        batch = self.gather(indices)
        records = []
        for k in range(count):
            record = {}
            for f in self.fields:
                value = batch[f.name]
                if f.fixed:
                    record[f.name] = value[k]
                else:
                    values, offsets = value
                    record[f.name] = values[offsets[k] : offsets[k + 1]].tobytes()
            records.append(record)
        return records

    # -- writing ---------------------------------------------------------------------------

    def append(self, record: Mapping[str, Any]) -> int:
        """Appends one record ({field: bytes | array | str}); returns its index."""
        return self.append_many([record])

    def append_many(self, records: Sequence[Mapping[str, Any]]) -> int:
        """Appends records; returns the first one's index. Fields a record lacks are absent
        in it."""
        self._check_names(records)
        return self._native().append_columns(_columns(records, [f.name for f in self.fields]))

    def modify(self, index: int, record: Mapping[str, Any]) -> None:
        """Replaces record ``index``."""
        self._check_names([record])
        self._native().modify(int(index), _columns([record], [f.name for f in self.fields]))

    def delete(self, index: int) -> None:
        """Deletes record ``index``: the last record takes its place."""
        self._native().delete(int(index))

    def commit(self) -> None:
        """Makes every write so far durable."""
        self._native().commit()

    # -- fields and datasets ---------------------------------------------------------------

    def add_field(self, name: str, compress: str = "raw") -> None:
        """Adds field ``name`` (raw, flate, zstd or zstd:LEVEL): the records stored so far lack it (an empty
        value) until ``write_field`` or ``modify`` gives them one."""
        native = self._native()
        if isinstance(native, _zrecord.Store):
            self._handle = native.add_field(name, compress)
        else:
            native.add_field(name, compress)
            self._handle = None  # reconnected: the new handle knows the field
        self._fields = None

    def write_field(self, field: str, start: int, values: Sequence[Any]) -> None:
        """Writes field ``field`` of records ``start .. start + len(values)``, their other
        fields unchanged (e.g. rewards computed after generation)."""
        if all(f.name != field for f in self.fields) and not isinstance(self._native(), _zrecord.Store):
            # Perhaps added since this handle was made (by another process): look again.
            self._handle, self._fields = None, None
        self._field(field)
        payloads = [_to_bytes(v).tobytes() for v in values]
        self._native().write_field(field, int(start), payloads)

    def _cluster(self, what: str) -> Any:
        native = self._native()
        if isinstance(native, _zrecord.Store):
            raise TypeError(f"{what} is a cluster's: this is a local dataset (a directory)")
        return native

    def dataset(self, name: str) -> "Dataset":
        """The cluster's dataset ``name``, over the same router and certificates."""
        self._cluster("dataset()")
        _, router, certs, timeout_ms, role, _, direct = (list(self._opener) + [None, True])[:7]
        opener = ("cluster", router, certs, timeout_ms, role, name, direct)
        return Dataset(opener, _zrecord.Client.connect(router, certs, timeout_ms, role, name, direct))

    def create_stream(self, name: str, dtype: Any = np.uint32, block_tokens: int = 16_384) -> "Stream":
        """Makes the cluster's dataset ``name`` a token stream (see ``zrecord.stream``);
        returns it, open for appending."""
        from .stream import create_cluster_stream

        return create_cluster_stream(self, name, dtype, block_tokens)

    def stream(self) -> "Stream":
        """The token stream this cluster dataset holds (as ``zrecord.open_stream(self)``)."""
        from .stream import open_stream

        return open_stream(self, writable=True)

    @property
    def reads_direct(self) -> bool:
        """True if this cluster dataset's gathers go straight to the nodes (one hop), False
        if through the router (``connect(..., direct=False)``, or nodes it cannot reach)."""
        return self._cluster("reads_direct").reads_direct()

    def datasets(self) -> list[dict]:
        """The cluster's datasets: name, records, committed, fields, bytes, id (when it was
        made) and commits (commits that changed its records)."""
        return [
            {"name": n, "records": r, "committed": c, "fields": [_field(f) for f in fs], "bytes": b, "id": i, "commits": k}
            for n, r, c, fs, b, i, k in self._cluster("datasets()").datasets()
        ]

    def create_dataset(self, name: str, fields: Sequence[Any], dicts: Mapping[str, bytes] | None = None) -> "Dataset":
        """Creates the cluster's dataset ``name`` with ``fields`` (as for ``create``:
        names, or (name, compression[, dtype[, shape]]) tuples); needs the operator role.
        ``dicts``: {field: zstd dictionary} for zstd fields of small records, e.g. from
        ``train_dictionary`` on a sample of them; the cluster keeps each and every node
        compresses the field's records with it."""
        pairs = [(str(field), bytes(data)) for field, data in (dicts or {}).items()]
        self._cluster("create_dataset()").create_dataset(name, _field_specs(fields), pairs)
        return self.dataset(name)

    def drop_dataset(self, name: str) -> None:
        """Drops the cluster's dataset ``name`` and every record in it (operator role)."""
        self._cluster("drop_dataset()").drop_dataset(name)

    def wait_len(self, length: int, timeout_ms: int = 30_000) -> int:
        """Waits until the dataset has committed ``length`` records (at most
        ``timeout_ms``); returns its committed length. Raises ``TimeoutError`` naming the
        length reached if it has not."""
        native = self._native()
        if not isinstance(native, _zrecord.Store):
            return native.wait_len(int(length), int(timeout_ms))
        import time  # noqa: PLC0415

        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            have = len(self)
            if have >= length:
                return have
            if time.monotonic() >= deadline:
                raise TimeoutError(f"waited {timeout_ms} ms for {length} records: the dataset has committed {have}")
            time.sleep(0.002)

    def _check_names(self, records: Sequence[Mapping[str, Any]]) -> None:
        known = {f.name for f in self.fields}
        for r in records:
            for name in r:
                if name not in known:
                    raise KeyError(f"unknown field '{name}' (the dataset has: {', '.join(sorted(known))})")


def _check_out(out: Mapping[str, Any], chosen: list[Field], count: int) -> dict:
    """``out`` checked against the fields gathered: each key one of them, each a typed
    field's, each destination of its dtype and shape ``(count, *shape)`` (NumPy arrays and
    CPU torch tensors, pinned or not) or, for any other buffer, of its size in bytes."""
    by_name = {f.name: f for f in chosen}
    checked = {}
    for name, dest in out.items():
        f = by_name.get(name)
        if f is None:
            raise KeyError(f"out names field '{name}', which this gather does not read (it reads: {', '.join(by_name)})")
        if not f.fixed:
            raise ValueError(f"out['{name}']: field '{name}' has records of varying size; only fields with a dtype and shape gather into out")
        if dest is None:
            continue
        if not isinstance(dest, np.ndarray) and callable(getattr(dest, "numpy", None)) and hasattr(dest, "is_pinned"):
            # A torch tensor: its CPU memory as an array, no copy (a GPU tensor refuses).
            try:
                dest = dest.numpy()
            except (RuntimeError, TypeError) as e:
                raise ValueError(f"out['{name}']: a tensor gathered into must be on the CPU ({e})") from None
        want = (count, *f.shape)
        if isinstance(dest, np.ndarray):
            if dest.dtype != f.dtype or dest.shape != want:
                raise ValueError(f"out['{name}'] is {dest.dtype}{list(dest.shape)}; field '{name}' gathers {count} records into {f.dtype}{list(want)}")
        else:
            size = memoryview(dest).nbytes
            if size != count * f.record_bytes:
                raise ValueError(f"out['{name}'] holds {size} bytes; {count} records of field '{name}' take {count * f.record_bytes}")
        checked[name] = dest
    return checked


def _writable_bytes(dest: Any) -> np.ndarray:
    """``dest`` (a NumPy array or any writable buffer) as a flat uint8 array over the same
    memory."""
    if isinstance(dest, np.ndarray):
        if not dest.flags.c_contiguous:
            raise ValueError("out arrays must be C-contiguous")
        if not dest.flags.writeable:
            raise ValueError("out arrays must be writable")
        return dest.reshape(-1).view(np.uint8)
    view = memoryview(dest)
    if view.readonly:
        raise ValueError("out buffers must be writable")
    return np.frombuffer(view.cast("B"), dtype=np.uint8)


def _typed(values: np.ndarray, f: Field, count: int) -> np.ndarray:
    return values.view(f.dtype).reshape((count, *f.shape))


def open(path: str | os.PathLike, writable: bool = False) -> Dataset:  # noqa: A001
    """Opens the dataset at ``path``: read-only by default (any number of readers, in any
    number of processes), or ``writable`` (this process alone)."""
    path = os.fspath(path)
    return Dataset(("local", path, writable), _zrecord.Store.open(path, writable))


def create(path: str | os.PathLike, fields: Sequence[Any]) -> Dataset:
    """Creates a dataset at ``path`` (a new or empty directory). ``fields``: names, or
    (name, compress) or (name, compress, dtype, shape) tuples, or ``Field``s; ``compress`` is
    "raw", "flate", "zstd" or "zstd:LEVEL" (1-22, default 3)."""
    path = os.fspath(path)
    return Dataset(("local", path, True), _zrecord.Store.create(path, _field_specs(fields)))


def _field_specs(fields: Sequence[Any]) -> list[tuple]:
    """Fields as ``create`` takes them, as (name, compress, dtype, shape) tuples."""
    specs = []
    for f in fields:
        if isinstance(f, str):
            specs.append((f, "raw", None, None))
        elif isinstance(f, Field):
            specs.append((f.name, f.compress, f.dtype.str if f.dtype is not None else None, list(f.shape) if f.shape is not None else None))
        else:
            name, compress, *rest = f
            dtype = np.dtype(rest[0]).str if rest and rest[0] is not None else None
            shape = [int(s) for s in rest[1]] if len(rest) > 1 and rest[1] is not None else None
            specs.append((name, compress, dtype, shape))
    return specs


def connect(router: str, certs: str | os.PathLike | None = None, timeout_ms: int = 30_000,
            role: str | None = None, dataset: str | None = None, direct: bool = True) -> Dataset:
    """The dataset of the zrecord cluster whose router is at ``router`` ("HOST:PORT"), with
    a client certificate from ``certs`` (the directory ``zr cluster-init`` made, or one role's
    directory in it; None for a router run with --insecure-dev). ``role`` is "reader"
    (gather, info, status), "writer" (also append, modify, delete, commit) or "operator";
    by default the writer certificate if ``certs`` holds one, else the reader's. A request
    the role does not allow raises ``zrecord.Error`` naming the role it needs. ``dataset``
    names one of the cluster's datasets (default: the one named "default"); the result's
    ``dataset(name)``, ``datasets()``, ``create_dataset`` and ``drop_dataset`` reach the
    others. Gathers go straight to the nodes that hold the records (one hop; the router says
    where they are, and stays where writes and admin requests go); ``direct=False`` sends
    them through the router, as does a client that cannot reach the nodes (said once in the
    log)."""
    certs = os.fspath(certs) if certs is not None else None
    opener = ("cluster", router, certs, timeout_ms, role, dataset, bool(direct))
    return Dataset(opener, _zrecord.Client.connect(router, certs, timeout_ms, role, dataset, bool(direct)))


def from_numpy(arrays: np.ndarray | Mapping[str, Any], path: str | os.PathLike, field: str = "data", compress: str | Mapping[str, str] = "raw") -> Dataset:
    """A dataset at ``path`` with one record per row of ``arrays``, committed; returned open
    read-only (so other processes may read it too). ``arrays`` is one array (the field
    ``field``) or {field: array} for several fields, all with the same number of rows (each
    field's dtype and row shape kept); {field: (values, offsets)} gives a field of records of
    varying size, as in ``from_arrays``. ``compress``: "raw", "flate", "zstd" or "zstd:LEVEL", for all or per field."""
    columns = dict(arrays) if isinstance(arrays, Mapping) else {field: arrays}
    if not columns:
        raise ValueError("from_numpy needs at least one array")
    specs, data, rows = [], {}, None
    for name, value in columns.items():
        how = compress.get(name, "raw") if isinstance(compress, Mapping) else compress
        if isinstance(value, tuple):
            values, offsets = value
            values = np.ascontiguousarray(values).reshape(-1).view(np.uint8)
            offsets = np.ascontiguousarray(offsets, dtype=np.int64)
            if offsets.ndim != 1 or offsets.size < 1:
                raise ValueError(f"field '{name}': offsets must be one-dimensional, with one more entry than records")
            count = offsets.size - 1
            first, last = int(offsets[0]), int(offsets[-1])
            specs.append((name, how))
            data[name] = (values[first:last], offsets - first)
        else:
            array = np.ascontiguousarray(value)
            if array.ndim < 1:
                raise ValueError(f"field '{name}': an array with at least one dimension (rows) is needed")
            count = array.shape[0]
            specs.append((name, how, array.dtype, array.shape[1:]))
            size = array[0].nbytes if count else 0
            flat = array.reshape(-1).view(np.uint8) if count else np.empty(0, np.uint8)
            data[name] = (flat, np.arange(count + 1, dtype=np.int64) * size)
        if rows is not None and count != rows:
            raise ValueError(f"field '{name}' has {count} records and the fields before it {rows}: every field needs one per record")
        rows = count
    with create(path, specs) as ds:
        if rows:
            ds._native().append_columns(data)
    return open(path)


def train_dict(path: str | os.PathLike, field: str, size: int = 112_640, level: int | None = None) -> dict:
    """Trains a zstd dictionary for ``field`` of the local dataset at ``path`` on a sample of
    its records and rewrites the dataset with the field compressed with it (``zstd``, at
    ``level`` or the field's own): for small records, which compress poorly alone. Offline
    and atomic, like ``zr dict train``: no other process may have the dataset open for
    writing. Returns the dictionary's id, size and the records it was trained on."""
    dict_id, size, samples = _zrecord.train_dict(os.fspath(path), field, int(size), level)
    return {"id": dict_id, "bytes": size, "samples": samples}


def train_dictionary(samples: Sequence[bytes], size: int = 112_640) -> bytes:
    """A zstd dictionary of at most ``size`` bytes trained on ``samples`` (records like the
    ones it will compress: thousands of them, varied), for ``create_dataset(..., dicts=)``."""
    return _zrecord.train_dictionary([bytes(s) for s in samples], int(size))


def from_arrays(values: np.ndarray, offsets: np.ndarray, path: str | os.PathLike, field: str = "data", compress: str = "raw") -> Dataset:
    """A dataset at ``path`` with record k = ``values[offsets[k]:offsets[k + 1]]``,
    committed; returned open read-only. Several fields: ``from_numpy({name: (values,
    offsets), ...}, path)``."""
    return from_numpy({field: (values, offsets)}, path, compress=compress)


class Sampler:
    """Batches of indices for one rank: ``order`` "sequential", "shuffle" (a seeded
    permutation per epoch), "random" (with replacement) or "sliding" (windows); every rank of
    ``ranks`` gets as many batches, with no communication (records left over by the split are
    left out of the epoch, with a warning saying how many); ``drop_last`` drops each epoch's
    last, partial batch. Iterating yields the rest of the
    current epoch; ``set_epoch`` moves to another. ``state_dict()`` / ``load_state_dict()``
    resume exactly."""

    def __init__(self, length: int, order: str = "shuffle", seed: int = 0, rank: int = 0, ranks: int = 1, batch: int = 1, drop_last: bool = False, window: int = 0, stride: int = 0, blocklist: Sequence[int] = ()):
        blocklist = sorted({int(r) for r in blocklist})
        self.config = dict(length=length, order=order, seed=seed, rank=rank, ranks=ranks, batch=batch, drop_last=drop_last, window=window, stride=stride, blocklist=blocklist)
        # Ranks always get equal shares (the engine leaves the uneven tail out, and says
        # so); `drop_last` drops each epoch's last, partial batch (PyTorch's default keeps it).
        # A blocked record is read nowhere: each position that would read it reads another.
        self._native = _zrecord.Sampler(length, order, seed, rank, ranks, batch, window, stride, blocklist)
        self.epoch = 0
        self.position = 0
        #: Records of each epoch no rank gets (an uneven split across ``ranks``).
        self.left_out = 0
        if order in ("sequential", "shuffle") and ranks > 1:
            self.left_out = int(length) - self._native.items_per_epoch() * int(ranks)
            if self.left_out:
                import warnings  # noqa: PLC0415

                warnings.warn(
                    f"{self.left_out} of {length} records are left out of each epoch, so that each of {ranks} ranks gets {self._native.items_per_epoch()}",
                    stacklevel=2,
                )

    def __getstate__(self) -> dict:
        # Its configuration and place: a worker process (Grain's, PyTorch's) rebuilds it.
        return {"config": self.config, "epoch": self.epoch, "position": self.position}

    def __setstate__(self, state: dict) -> None:
        c = state["config"]
        self.config = dict(c)
        self._native = _zrecord.Sampler(c["length"], c["order"], c["seed"], c["rank"], c["ranks"], c["batch"], c["window"], c["stride"], c.get("blocklist", []))
        self.epoch, self.position = state["epoch"], state["position"]
        self.left_out = 0
        if c["order"] in ("sequential", "shuffle") and c["ranks"] > 1:
            self.left_out = int(c["length"]) - self._native.items_per_epoch() * int(c["ranks"])

    def epoch_items(self) -> int:
        """Indices this rank gets per epoch (whole batches only with ``drop_last``)."""
        items = self._native.items_per_epoch()
        if self.config["drop_last"]:
            items -= items % self.config["batch"]
        return items

    def __len__(self) -> int:
        return -(-self.epoch_items() // self.config["batch"])

    def set_epoch(self, epoch: int) -> None:
        """Starts epoch ``epoch`` from its beginning."""
        self.epoch = int(epoch)
        self.position = 0

    def batch_at(self, epoch: int, position: int) -> np.ndarray:
        """The batch of ``epoch`` starting at ``position`` (in indices)."""
        end = min(position + self.config["batch"], self.epoch_items())
        return self._native.indices(epoch, position, end)

    def __iter__(self) -> Iterator[np.ndarray]:
        per_epoch = self.epoch_items()
        while self.position < per_epoch:
            batch = self.batch_at(self.epoch, self.position)
            self.position += batch.size
            yield batch
        # The next iteration starts the next epoch.
        self.epoch += 1
        self.position = 0

    def state_dict(self) -> dict:
        """Where the run is: the same on every rank (each rank's batch k of an epoch is its
        part of the epoch's global batch k), enough to resume exactly."""
        return self.state_at(self.epoch, self.position)

    def describe(self) -> dict:
        """The order's part of a run's description (``run.json``; see ``Loader.describe``)."""
        c = self.config
        order: dict[str, Any] = {"kind": c["order"]}
        if c["order"] == "sliding":
            order.update(window=c["window"], stride=c["stride"])
        return {
            "format": "zrecord-run",
            "version": 1,
            "order": {"sampler": {"len": c["length"], "order": order, "seed": c["seed"], "rank": 0, "ranks": c["ranks"], "batch": c["batch"], "tail": "drop"}},
            "datasets": [],
            "blocklist": [[0, r] for r in c["blocklist"]],
        }

    def manifest(self, step: int) -> list[dict]:
        """Global batch ``step`` — what every rank reads, in rank order — computed, not
        logged: {"rank", "slot", "dataset", "record", "replaced", "epoch"} per position
        (``epoch``: the dataset's own)."""
        return _manifest(self.describe(), step)

    def skip(self, steps: int) -> None:
        """Counts the next ``steps`` global batches as read, unread (Megatron's
        ``--iterations-to-skip``): the state after is the one a run that read them has."""
        per_epoch = self.epoch_items()
        position = self.position + int(steps) * self.config["batch"]
        while position >= per_epoch:
            position -= per_epoch
            self.epoch += 1
        self.position = position

    def state_at(self, epoch: int, position: int) -> dict:
        """The state at ``position`` of ``epoch`` (the end of an epoch is the next's start)."""
        c = self.config
        if position >= self.epoch_items():
            epoch, position = epoch + 1, 0
        return {
            "seed": c["seed"],
            "epoch": epoch,
            "position": position,
            "global_batches": -(-position // c["batch"]),
            "len": c["length"],
            "ranks": c["ranks"],
            "batch": c["batch"],
            "blocklist": list(c["blocklist"]),
        }

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Resumes from ``state``, taken with these ranks or any others with the same global
        batch (``batch × ranks``): every whole global batch from there on is the one an
        uninterrupted run reads (an epoch's last, partial one splits as evenly as the ranks
        allow). Refused, naming what differs, if it belongs to another configuration."""
        c = self.config
        missing = [k for k in ("seed", "epoch", "position", "len", "ranks") if k not in state]
        if missing:
            raise ValueError(f"not a sampler's state: it lacks {', '.join(missing)} (give what state_dict() returned)")
        epoch, position = int(state["epoch"]), int(state["position"])
        if int(state["ranks"]) != c["ranks"]:
            theirs = state.get("batch")
            if theirs is None:
                raise ValueError(f"the checkpoint was taken with {state['ranks']} ranks and does not say its batch size, so it resumes only under {state['ranks']} ranks; this sampler has {c['ranks']}")
            if int(theirs) * int(state["ranks"]) != c["batch"] * c["ranks"]:
                raise ValueError(f"the checkpoint was taken with a global batch (batch × ranks) of {int(theirs) * int(state['ranks'])}; this sampler has {c['batch'] * c['ranks']}")
            position = int(state["global_batches"]) * c["batch"]
            if position >= self._native.items_per_epoch():
                epoch, position = epoch + 1, 0
        self._native.check_state(state["seed"], epoch, position, state["len"], c["rank"], c["ranks"])
        before = set(state.get("blocklist", []))
        if before - set(c["blocklist"]):
            raise ValueError(f"the checkpoint's blocklist has records this sampler's lacks ({sorted(before - set(c['blocklist']))[:5]}…): positions already read would be read differently")
        added = set(c["blocklist"]) - before
        self.epoch, self.position = epoch, position
        if added:
            # How many positions of the rest of this epoch, over every rank, change.
            ranks = [Sampler(c["length"], c["order"], c["seed"], r, c["ranks"], c["batch"], c["drop_last"], c["window"], c["stride"]) for r in range(c["ranks"])]
            per_epoch = self.epoch_items()
            changed = sum(int(np.isin(s._native.indices(epoch, position, per_epoch), list(added)).sum()) for s in ranks) if position < per_epoch else 0
            import warnings  # noqa: PLC0415

            warnings.warn(f"{len(added)} records added to the blocklist: {changed} positions of the rest of epoch {epoch} read a replacement", stacklevel=2)


class Mixture:
    """Several datasets read by weight as one stream of global batches of ``batch × ranks``
    records, rank ``rank`` taking ``batch`` of each. ``lengths``: each dataset's records;
    ``weights``: their proportions (any non-negative numbers); ``stages``: weights that change
    at global-batch boundaries, ``[(start_batch, weights), ...]`` after the first. Each
    dataset is read without replacement in its own shuffled epochs, continuing across
    epochs and stages. Batches are pairs of int64 arrays ``(source, index)``: which dataset,
    and which of its records. Iterating yields batch after batch (the stream has no end);
    ``state_dict()`` is the same on every rank and resumes under any ``ranks`` that divides
    the same global batch."""

    def __init__(self, lengths: Sequence[int], weights: Sequence[float], seed: int = 0, rank: int = 0, ranks: int = 1, batch: int = 1, stages: Sequence[tuple[int, Sequence[float]]] | None = None, blocklist: Sequence[tuple[int, int]] = ()):
        all_stages = [(0, [float(w) for w in weights])] + [(int(b), [float(w) for w in ws]) for b, ws in (stages or [])]
        blocklist = sorted({(int(d), int(r)) for d, r in blocklist})
        self.config = dict(lengths=[int(n) for n in lengths], seed=seed, rank=rank, ranks=ranks, batch=batch, stages=all_stages, blocklist=blocklist)
        self._native = _zrecord.Mixture([int(n) for n in lengths], all_stages, seed, rank, ranks, batch, blocklist)
        #: Global batches consumed.
        self.batches = 0
        #: The global batch the stream ends at (a token mixture's budgets all spent), if any.
        self.end: int | None = None

    def __getstate__(self) -> dict:
        # Its configuration and place: a worker process (Grain's, PyTorch's) rebuilds it.
        return {"config": self.config, "batches": self.batches, "end": self.end}

    def __setstate__(self, state: dict) -> None:
        c = state["config"]
        self.config = dict(c)
        stages = [(int(b), list(ws)) for b, ws in c["stages"]]
        blocklist = [(int(d), int(r)) for d, r in c.get("blocklist", [])]
        self._native = _zrecord.Mixture(list(c["lengths"]), stages, c["seed"], c["rank"], c["ranks"], c["batch"], blocklist)
        self.batches = state["batches"]
        self.end = state.get("end")

    def batch_at(self, batch: int) -> tuple[np.ndarray, np.ndarray]:
        """This rank's part of global batch ``batch``: (source, index)."""
        return self._native.batch(int(batch))

    def describe(self) -> dict:
        """The order's part of a run's description (``run.json``; see ``Loader.describe``)."""
        c = self.config
        return {
            "format": "zrecord-run",
            "version": 1,
            "order": {"mixture": {"lengths": c["lengths"], "stages": [{"start": b, "weights": ws} for b, ws in c["stages"]], "seed": c["seed"], "rank": 0, "ranks": c["ranks"], "batch": c["batch"]}},
            "datasets": [],
            "blocklist": [list(p) for p in c["blocklist"]],
        }

    def manifest(self, step: int) -> list[dict]:
        """Global batch ``step`` — what every rank reads, in rank order — computed, not
        logged: {"rank", "slot", "dataset", "record", "replaced", "epoch"} per position
        (``epoch``: the dataset's own)."""
        return _manifest(self.describe(), step)

    def skip(self, steps: int) -> None:
        """Counts the next ``steps`` global batches as read, unread."""
        self.batches += int(steps)

    def drawn_before(self, batch: int) -> list[int]:
        """Records of each dataset read before global batch ``batch`` (by every rank)."""
        return self._native.drawn_before(int(batch))

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        while self.end is None or self.batches < self.end:
            batch = self.batch_at(self.batches)
            self.batches += 1
            yield batch

    @classmethod
    def by_tokens(cls, sources: Sequence[tuple[float, Any]], seed: int = 0, rank: int = 0, ranks: int = 1, batch: int = 1) -> "Mixture":
        """A mixture weighed in tokens: ``sources`` is [(token weight, source), …], each
        source a ``TokenSource`` (a dataset, a stream's packed rows or windows, with its
        tokens per record and an optional budget) or a nested list of the same shape, its
        weights renormalized at its level as its sources run out. A source's record weight is
        its token weight over its tokens per record; a budget spent drops it at the next
        global batch, and when every source has one and all are spent, the stream ends at
        global batch ``end``. The datasets of a ``Loader`` over it are the leaves, in order
        (``leaves``)."""
        import json  # noqa: PLC0415

        leaves: list[TokenSource] = []

        def tree(node: Any) -> dict:
            if isinstance(node, TokenSource):
                leaves.append(node)
                leaf: dict[str, Any] = {"len": node.length, "tokens_per_record": node.tokens_per_record}
                if node.tokens is not None:
                    leaf["tokens"] = int(node.tokens)
                if node.epochs is not None:
                    leaf["epochs"] = float(node.epochs)
                return leaf
            if isinstance(node, (list, tuple)) and node and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in node):
                return {"group": [[float(w), tree(child)] for w, child in node]}
            raise TypeError(f"a mixture's source is a TokenSource or a list of (weight, source), not {type(node).__name__}")

        spec = tree(list(sources))
        stages, end, budgets = _zrecord.token_mixture(json.dumps(spec), int(seed), int(rank), int(ranks), int(batch))
        mixture = cls([leaf.length for leaf in leaves], stages[0][1], seed=seed, rank=rank, ranks=ranks, batch=batch, stages=stages[1:])
        mixture.end = end
        mixture.budgets = budgets
        mixture.leaves = [leaf.dataset for leaf in leaves]
        return mixture

    def state_dict(self) -> dict:
        import json  # noqa: PLC0415

        return json.loads(self._native.state_at(self.batches))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resumes from ``state`` (taken with any ranks of the same global batch); refused,
        naming what differs, if it is of another stream."""
        import json  # noqa: PLC0415

        self.batches = self._native.check_state(json.dumps(dict(state)))


class TokenSource:
    """A source of a token-weighted mixture (``Mixture.by_tokens``): ``dataset`` (a dataset,
    or a stream's packed rows or windows), its tokens per record (by default a packed row's
    real tokens on average, a window's width; give it for record datasets, e.g. the mean of
    ``token_lengths``), and a budget: ``tokens`` read at most, or ``epochs`` over it."""

    def __init__(self, dataset: Any, tokens_per_record: float | None = None, tokens: int | None = None, epochs: float | None = None):
        if tokens is not None and epochs is not None:
            raise ValueError("give a budget of tokens or of epochs, not both")
        if tokens_per_record is None:
            stats = getattr(dataset, "stats", None)
            if callable(stats):
                s = stats()
                tokens_per_record = s["tokens"] / max(1, s["rows"])
            elif hasattr(dataset, "width"):
                tokens_per_record = float(dataset.width)
            else:
                raise ValueError("give tokens_per_record for a record dataset (e.g. the mean of zrecord.token_lengths)")
        self.dataset = dataset
        self.length = len(dataset) if not isinstance(dataset, (int, np.integer)) else int(dataset)
        self.tokens_per_record = float(tokens_per_record)
        self.tokens = tokens
        self.epochs = epochs


class RampSampler:
    """Batches of indices for one rank whose global size changes during the run: a ramp as
    Megatron-LM's ``--rampup-batch-size START INCREMENT SAMPLES`` gives it up to ``global``
    (``ramp=(start, increment, samples)``), or explicit ``stages`` [(from_sample, size), …].
    Step k takes the next global batch of the run's order (``seed``'s shuffle of ``length``
    records, epoch after epoch); rank ``rank`` of ``ranks`` its ``rank``-th equal slice.

    ``state_dict()`` is what was consumed — steps, samples, and the size of every stretch of
    steps — the same on every rank; ``load_state_dict`` resumes under any ``ranks`` that
    divides the global batch in force then, accepts a schedule changed for steps not taken
    yet (saying so in ``changes_at``), and refuses one that rewrites a step already taken,
    naming it. Iterating yields steps without end."""

    def __init__(self, length: int, global_batch: int | None = None, ramp: tuple[int, int, int] | None = None, stages: Sequence[tuple[int, int]] | None = None, seed: int = 0, rank: int = 0, ranks: int = 1, mixture: "Mixture | None" = None):
        import json  # noqa: PLC0415

        if stages is not None:
            if ramp is not None:
                raise ValueError("give a ramp or stages, not both")
            schedule = {"Stages": [[int(a), int(b)] for a, b in stages]}
        elif ramp is not None:
            if global_batch is None:
                raise ValueError("a ramp needs the global_batch it ramps up to")
            start, increment, samples = (int(x) for x in ramp)
            schedule = {"Ramp": {"start": start, "increment": increment, "samples": samples, "global": int(global_batch)}}
        elif global_batch is not None:
            schedule = {"Stages": [[0, int(global_batch)]]}
        else:
            raise ValueError("give a global_batch, a ramp (with global_batch) or stages")
        self.config = dict(length=int(length), seed=int(seed), rank=int(rank), ranks=int(ranks), schedule=schedule)
        #: A mixture whose stream the steps read (its global batch 1), if any; a Loader over
        #: the ramp is then given its datasets.
        self.mixture = mixture
        if mixture is not None:
            if mixture.config["batch"] * mixture.config["ranks"] != 1:
                raise ValueError("a ramp reads a mixture made with batch=1 and ranks=1 (its stages then start at positions); the ramp splits each step among the ranks")
            self._native = _zrecord.RampSampler.over_mixture(mixture._native, int(rank), int(ranks), json.dumps(schedule))
        else:
            self._native = _zrecord.RampSampler(int(length), int(seed), int(rank), int(ranks), json.dumps(schedule))
        self._state = self._native.start()
        #: The first step the schedule changed at when the run was resumed (None: unchanged).
        self.changes_at: int | None = None

    def __getstate__(self) -> dict:
        return {"config": self.config, "state": self._state, "mixture": self.mixture}

    def __setstate__(self, state: dict) -> None:
        import json  # noqa: PLC0415

        c = state["config"]
        self.config = dict(c)
        self.mixture = state.get("mixture")
        if self.mixture is not None:
            self._native = _zrecord.RampSampler.over_mixture(self.mixture._native, c["rank"], c["ranks"], json.dumps(c["schedule"]))
        else:
            self._native = _zrecord.RampSampler(c["length"], c["seed"], c["rank"], c["ranks"], json.dumps(c["schedule"]))
        self._state = state["state"]
        self.changes_at = None

    @property
    def steps(self) -> int:
        import json  # noqa: PLC0415

        return json.loads(self._state)["steps"]

    @property
    def samples(self) -> int:
        import json  # noqa: PLC0415

        return json.loads(self._state)["samples"]

    def global_batch(self, samples: int | None = None) -> int:
        """The global batch of the step after ``samples`` consumed (default: the next)."""
        return self._native.global_batch(self.samples if samples is None else int(samples))

    def step_at(self, state: str) -> tuple[np.ndarray, str]:
        """This rank's indices of the step at ``state`` (as JSON), and the state after it."""
        return self._native.step(state)

    def __iter__(self) -> Iterator[np.ndarray]:
        while True:
            indices, self._state = self._native.step(self._state)
            yield indices

    def state_dict(self) -> dict:
        import json  # noqa: PLC0415

        return json.loads(self._state)

    def describe(self) -> dict:
        """The order's part of a run's description (``run.json``; see ``Loader.describe``)."""
        c = self.config
        ramp: dict[str, Any] = {"schedule": c["schedule"], "ranks": c["ranks"], "len": c["length"], "seed": c["seed"]}
        if self.mixture is not None:
            ramp["mixture"] = self.mixture.describe()["order"]["mixture"]
        return {"format": "zrecord-run", "version": 1, "order": {"ramp": ramp}, "datasets": [], "blocklist": []}

    def manifest(self, step: int) -> list[dict]:
        """Global batch ``step`` — what every rank reads, in rank order — computed from the
        schedule, not logged: {"rank", "slot", "dataset", "record", "replaced", "epoch"}."""
        return _manifest(self.describe(), step)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        import json  # noqa: PLC0415

        self._state, self.changes_at = self._native.resume(json.dumps(dict(state)))
        if self.changes_at is not None:
            import warnings  # noqa: PLC0415

            warnings.warn(f"the batch-size schedule changes from step {self.changes_at} on, which no step taken so far saw", stacklevel=2)


class TokenBudget:
    """Variable-length examples (``lengths`` tokens each) in micro-batches of at most
    ``max_tokens`` tokens — ``cost="padded"``: count × longest, or ``"packed"``: their sum —
    every rank of ``ranks`` getting ``accumulation`` micro-batches in every step, with no
    communication. Each epoch takes the examples in its own shuffled order, ``lookahead`` at
    a time sorted by length. ``remainder`` says what an epoch's micro-batches left over by
    its last whole step become: ``"carry"`` (the next epoch completes the step), ``"pad"``
    (empty micro-batches, given as None) or ``"drop"``; ``too_long`` says what an example
    longer than the budget becomes: ``"refuse"`` (a ValueError naming it) or ``"skip"``.

    Iterating yields this rank's steps without end: each a list of ``accumulation``
    micro-batches, each an array of example indices (or None). ``state_dict()`` is the same
    on every rank and resumes under any ``ranks`` and ``accumulation``; ``gather`` reads a
    micro-batch of token arrays from a dataset, padded or packed."""

    _PLAN_KEYS = ("seed", "len", "max_tokens", "cost", "lookahead", "remainder", "too_long")

    def __init__(self, lengths: Any, max_tokens: int, rank: int = 0, ranks: int = 1, accumulation: int = 1, cost: str = "padded", lookahead: int = 1024, remainder: str = "carry", too_long: str = "refuse", seed: int = 0):
        lengths = np.ascontiguousarray(np.asarray(lengths).reshape(-1), dtype=np.uint64)
        if not 0 <= int(rank) < int(ranks):
            raise ValueError(f"rank {rank} is not one of the {ranks} ranks")
        self.config = dict(len=int(lengths.size), max_tokens=int(max_tokens), rank=int(rank), ranks=int(ranks), accumulation=int(accumulation), cost=cost, lookahead=int(lookahead), remainder=remainder, too_long=too_long, seed=int(seed))
        self._native = _zrecord.TokenBudget(lengths, int(max_tokens), cost, int(lookahead), int(ranks), int(accumulation), remainder, too_long, int(seed))
        self._lengths = lengths
        #: Where the next step starts: the next micro-batch is ``micro`` of ``epoch``.
        self.epoch = 0
        self.micro = 0

    @property
    def skipped(self) -> int:
        """Examples left out for being longer than the budget (``too_long="skip"``)."""
        return self._native.skipped()

    def step_at(self, epoch: int, micro: int) -> tuple[list, int, int]:
        """This rank's micro-batches of the step starting at (``epoch``, ``micro``), and
        where the next starts."""
        return self._native.step(int(epoch), int(micro), self.config["rank"])

    def __iter__(self) -> Iterator[list]:
        while True:
            step, epoch, micro = self.step_at(self.epoch, self.micro)
            if not step:
                return  # no example fits the budget
            self.epoch, self.micro = epoch, micro
            yield step

    def state_dict(self) -> dict:
        c = self.config
        return {key: c[key] for key in self._PLAN_KEYS} | {"epoch": self.epoch, "micro": self.micro}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resumes where ``state`` says (taken under any ranks and accumulation); refused,
        naming what differs, if it is of another schedule."""
        missing = [k for k in (*self._PLAN_KEYS, "epoch", "micro") if k not in state]
        if missing:
            raise ValueError(f"not a token budget's state: it lacks {', '.join(missing)}")
        for key in self._PLAN_KEYS:
            if state[key] != self.config[key]:
                raise ValueError(f"the checkpoint's {key} is {state[key]!r} and this schedule's is {self.config[key]!r}: it is of another schedule")
        self.epoch, self.micro = int(state["epoch"]), int(state["micro"])

    def gather(self, dataset: Dataset, micro: Any, field: str, dtype: Any = np.uint32, mask_field: str | None = None) -> dict | None:
        """Micro-batch ``micro`` (example indices) of ``field`` (token arrays of ``dtype``):
        padded (``cost="padded"``): {"tokens": (B, longest), "lengths": (B,), ["loss_mask":
        (B, longest)]}; packed: {"tokens": (1, total), "positions", "segment_ids",
        ["loss_mask"], "cu_seqlens", "max_seqlen"}. None for a padding micro-batch."""
        if micro is None:
            return None
        dtype = np.dtype(dtype)
        names = [field] if mask_field is None else [field, mask_field]
        got = dataset.gather(micro, names)
        values, offsets = got[field]
        tokens = values.view(dtype)
        lengths = np.diff(offsets) // dtype.itemsize
        starts = offsets[:-1] // dtype.itemsize
        mask = None
        if mask_field is not None:
            mvalues, moffsets = got[mask_field]
            mask = mvalues.astype(np.bool_)
            if not np.array_equal(np.diff(moffsets), lengths):
                raise ValueError(f"field '{mask_field}' holds a mask of another length than '{field}''s tokens")
        if self.config["cost"] == "padded":
            longest = int(lengths.max(initial=0))
            out = np.zeros((lengths.size, longest), dtype=dtype)
            keep = np.zeros((lengths.size, longest), dtype=np.bool_) if mask is not None else None
            for k, (start, n) in enumerate(zip(starts, lengths)):
                out[k, :n] = tokens[start : start + n]
                if keep is not None:
                    keep[k, :n] = mask[start : start + n]
            batch = {"tokens": out, "lengths": lengths.astype(np.int64)}
            if keep is not None:
                batch["loss_mask"] = keep
            return batch
        cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        positions = np.arange(int(cu[-1]), dtype=np.int32) - np.repeat(cu[:-1], lengths)
        segments = np.repeat(np.arange(1, lengths.size + 1, dtype=np.int32), lengths)
        batch = {"tokens": tokens.reshape(1, -1), "positions": positions.reshape(1, -1), "segment_ids": segments.reshape(1, -1), "cu_seqlens": cu, "max_seqlen": int(lengths.max(initial=0))}
        if mask is not None:
            batch["loss_mask"] = mask.reshape(1, -1)
        return batch


def token_lengths(dataset: Dataset, field: str, dtype: Any = np.uint32, chunk: int = 1 << 16) -> np.ndarray:
    """Tokens in each record's ``field`` (token arrays of ``dtype``): what ``TokenBudget``
    takes. Reads the field once, ``chunk`` records at a time."""
    itemsize = np.dtype(dtype).itemsize
    n = len(dataset)
    out = np.empty(n, dtype=np.uint64)
    for start in range(0, n, chunk):
        _, offsets = dataset.gather(np.arange(start, min(start + chunk, n), dtype=np.uint64), [field])[field]
        out[start : start + offsets.size - 1] = np.diff(offsets) // itemsize
    return out


class Loader:
    """Batches of ``dataset`` in ``sampler``'s order, ``prefetch`` batches gathered ahead on
    ``workers`` threads (gathers release the GIL). Yields {field: array or (values,
    offsets)}. ``state_dict()`` is the state after the last batch yielded — batches
    prefetched but not yet yielded are not counted — so a loader resumed from it yields
    exactly the batches an uninterrupted one would have.

    Over a ``Mixture``, ``dataset`` is the sequence of its datasets (local or a cluster's,
    each as long as the mixture says), ``fields`` names what to read (each dataset must have
    each, with the same dtype and shape where typed), and each batch has a ``source`` array
    besides: which dataset each row came from. It yields batches with no end; its
    ``state_dict()`` is the mixture's after the last batch yielded."""

    def __init__(self, dataset: Dataset | Sequence[Dataset], sampler: "Sampler | Mixture | RampSampler", prefetch: int = 2, workers: int | None = None, fields: Sequence[str] | None = None):
        self.dataset = dataset
        self.sampler = sampler
        self.prefetch = max(1, int(prefetch))
        self.workers = workers or min(4, os.cpu_count() or 1)
        self.fields = fields
        if isinstance(sampler, Mixture):
            self._chosen = _mixture_fields(list(dataset), sampler, fields)
            self._consumed = sampler.batches
        elif isinstance(sampler, RampSampler):
            self._consumed = None  # the ramp sampler keeps its own place
        else:
            self._consumed = (sampler.epoch, sampler.position)

    def __iter__(self) -> Iterator[dict]:
        if isinstance(self.sampler, Mixture):
            yield from self._mixture_batches()
            return
        if isinstance(self.sampler, RampSampler):
            yield from self._ramp_batches()
            return
        native = self.dataset._native()
        windows = isinstance(native, (_zrecord.StreamWindows, _zrecord.ClusterStreamWindows))
        packed = isinstance(native, _zrecord.StreamPacked)
        # The engine's loader reads records, windows (a stream's spans come with gathers)
        # and packed rows.
        if isinstance(native, _zrecord.Store) or packed or (windows and self.dataset.stream.spans == 0):
            yield from self._native_batches(native)
            return
        epoch, position = self.sampler.epoch, self.sampler.position
        per_epoch = self.sampler.epoch_items()
        starts = []
        p = position
        while p < per_epoch:
            starts.append(p)
            p = min(p + self.sampler.config["batch"], per_epoch)
        pending: deque = deque()
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            next_start = 0
            while next_start < len(starts) or pending:
                while next_start < len(starts) and len(pending) < self.prefetch:
                    indices = self.sampler.batch_at(epoch, starts[next_start])
                    pending.append((starts[next_start], indices.size, pool.submit(self.dataset.gather, indices, self.fields)))
                    next_start += 1
                start, size, future = pending.popleft()
                batch = future.result()
                self.sampler.epoch, self.sampler.position = epoch, start + size
                self._consumed = (epoch, start + size)
                yield batch
        self.sampler.epoch, self.sampler.position = epoch + 1, 0
        self._consumed = (epoch + 1, 0)

    def _native_batches(self, store: Any) -> Iterator[dict]:
        """A local dataset's batches, gathered ahead by the engine's own loader (threads
        without the GIL; each batch's buffers moved into NumPy)."""
        epoch, position = self.sampler.epoch, self.sampler.position
        per_epoch = self.sampler.epoch_items()
        fields = [f.name for f in self.dataset.fields] if self.fields is None else _names_of(self.fields)
        chosen = [self.dataset._field(n) for n in fields]
        if position < per_epoch:
            loader = _zrecord.NativeLoader(store, self.sampler._native, epoch, position, fields, self.prefetch, self.workers)
            for _, start, end, columns in loader:
                if end > per_epoch:
                    break  # drop_last: the partial batch is not this epoch's
                batch = {}
                for f, (values, offsets) in zip(chosen, columns):
                    batch[f.name] = _typed(values, f, end - start) if f.fixed else (values, offsets)
                finish = getattr(self.dataset, "_finish", None)
                if finish is not None:
                    batch = finish(batch)
                self.sampler.epoch, self.sampler.position = epoch, end
                self._consumed = (epoch, end)
                yield batch
        self.sampler.epoch, self.sampler.position = epoch + 1, 0
        self._consumed = (epoch + 1, 0)

    def _ramp_batches(self) -> Iterator[dict]:
        """Steps of a batch-size schedule (without end), ``prefetch`` gathered ahead on
        ``workers`` threads; the state counts only the steps yielded."""
        sampler = self.sampler
        finish = getattr(self.dataset, "_finish", None)
        pending: deque = deque()
        ahead = sampler._state
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            while True:
                while len(pending) < max(1, self.prefetch):
                    if sampler.mixture is not None:
                        sources, records, after = sampler._native.step_sources(ahead)
                        pending.append((after, pool.submit(self._gather_mixed, sources, records)))
                    else:
                        indices, after = sampler.step_at(ahead)
                        pending.append((after, pool.submit(self.dataset.gather, indices, self.fields)))
                    ahead = after
                after, future = pending.popleft()
                batch = future.result()
                if finish is not None and isinstance(batch.get("cu_seqlens"), tuple):
                    batch = finish(batch)
                sampler._state = after
                yield batch

    def _gather_mixed(self, sources: np.ndarray, records: np.ndarray) -> dict:
        """A ramp's step over a mixture: each dataset's rows in one gather, in step order."""
        from .torch import gather_mixed  # noqa: PLC0415

        datasets = list(self.dataset)
        names = [f.name for f in _mixture_fields(datasets, self.sampler.mixture, self.fields)]
        per_batch = [n for n in ("cu_seqlens", "max_seqlen") if n in names]
        gathered = [n for n in names if n not in per_batch]
        if per_batch and "segment_ids" not in gathered:
            gathered.append("segment_ids")
        batch = gather_mixed(datasets, gathered, sources, records)
        if per_batch:
            cu, longest = _cu_seqlens(batch["segment_ids"])
            batch.update({"cu_seqlens": cu, "max_seqlen": longest})
            batch = {k: v for k, v in batch.items() if k in names or k == "source"}
        return batch

    def _mixture_batches(self) -> Iterator[dict]:
        """A mixture's batches, gathered ahead by the engine's mixture loader (each dataset's
        rows of a batch in one gather, put back in batch order, on threads without the GIL)."""
        mixture = self.sampler
        natives = [ds._native() for ds in self.dataset]
        # A batch's cu_seqlens and max_seqlen are the mixed batch's, not any one source's:
        # made here from its rows' segment ids.
        per_batch = [n for n in ("cu_seqlens", "max_seqlen") if any(f.name == n for f in self._chosen)]
        chosen = [f for f in self._chosen if f.name not in per_batch]
        if per_batch and not any(f.name == "segment_ids" for f in chosen):
            chosen.append(self.dataset[0]._field("segment_ids"))
        names = [f.name for f in chosen]
        wanted = {f.name for f in self._chosen}
        loader = _zrecord.NativeMixtureLoader(natives, mixture._native, mixture.batches, names, self.prefetch, self.workers)
        for done, source, _, columns in loader:
            if mixture.end is not None and done >= mixture.end:
                break  # every budget spent
            count = source.size
            batch: dict[str, Any] = {"source": source}
            for f, (values, offsets) in zip(chosen, columns):
                batch[f.name] = _typed(values, f, count) if f.fixed else (values, offsets)
            if per_batch:
                cu, longest = _cu_seqlens(batch["segment_ids"])
                batch.update({"cu_seqlens": cu, "max_seqlen": longest})
                batch = {k: v for k, v in batch.items() if k in wanted or k == "source"}
            mixture.batches = done + 1
            self._consumed = done + 1
            yield batch

    def __len__(self) -> int:
        return len(self.sampler)

    def describe(self) -> dict:
        """The run's complete description (``run.json``: versioned; its order, datasets and
        blocklist), from which ``zr explain`` and ``manifest`` compute any step."""
        description = self.sampler.describe()
        description["datasets"] = [_dataset_entry(ds, k) for k, ds in enumerate(self._datasets())]
        return description

    def _datasets(self) -> list:
        several = isinstance(self.sampler, Mixture) or (isinstance(self.sampler, RampSampler) and self.sampler.mixture is not None)
        return list(self.dataset) if several else [self.dataset]

    def manifest(self, step: int) -> list[dict]:
        """Global batch ``step`` of this run, every rank's part in rank order (see
        ``Sampler.manifest``), datasets by name."""
        return _manifest(self.describe(), step)

    def state_dict(self) -> dict:
        """Where the run is, and its order proof (``proof``): digests of its description and
        of every dataset's contents (a local dataset's commit, a stream's commit and table
        CRCs), checked when the state is loaded."""
        if isinstance(self.sampler, Mixture):
            state = self.sampler.state_dict()
            state["batches"] = self._consumed
        elif isinstance(self.sampler, RampSampler):
            state = self.sampler.state_dict()
        else:
            state = self.sampler.state_at(*self._consumed)
        state["proof"] = self._proof()
        return state

    def _proof(self) -> dict:
        import hashlib  # noqa: PLC0415
        import json  # noqa: PLC0415

        description = self.describe()
        blocklist = description.pop("blocklist", [])
        return {
            "version": description["version"],
            "order": hashlib.sha256(json.dumps(_order_identity(description["order"]), sort_keys=True).encode()).hexdigest()[:32],
            "blocklist": len(blocklist),
            "datasets": [[entry["name"], _identity(ds)] for entry, ds in zip(description["datasets"], self._datasets())],
        }

    def load_state_dict(self, state: Mapping[str, Any], force: bool = False) -> None:
        """Resumes from ``state``. Its order proof is checked first: a changed configuration,
        another version of the order functions, or a dataset whose contents changed since
        is refused, naming what differs — unless ``force``, which resumes and says it."""
        proof = state.get("proof")
        if proof is not None:
            ours = self._proof()
            differs = []
            if proof.get("version") != ours["version"]:
                differs.append(f"the order functions' version ({proof.get('version')} then, {ours['version']} now)")
            if proof.get("order") != ours["order"]:
                differs.append("the order's configuration (seed, lengths, ranks, batch, weights or stages)")
            then, now = proof.get("datasets", []), ours["datasets"]
            if [n for n, _ in then] != [n for n, _ in now]:
                differs.append(f"the datasets ({', '.join(n for n, _ in then)} then, {', '.join(n for n, _ in now)} now)")
            for (name, identity), (_, current) in zip(then, now):
                if identity is not None and current is not None and identity != current:
                    differs.append(f"dataset '{name}' changed since the checkpoint (its contents are not what the run read)")
            if differs:
                message = "the checkpoint's order proof does not hold: " + "; ".join(differs)
                if not force:
                    raise ValueError(message + " (load_state_dict(state, force=True) resumes anyway)")
                import warnings  # noqa: PLC0415

                warnings.warn(message + "; resumed anyway", stacklevel=2)
        state = {k: v for k, v in state.items() if k != "proof"}
        self.sampler.load_state_dict(state)
        if isinstance(self.sampler, RampSampler):
            return
        if isinstance(self.sampler, Mixture):
            self._consumed = self.sampler.batches
        else:
            self._consumed = (self.sampler.epoch, self.sampler.position)


def _order_identity(order: Mapping[str, Any]) -> dict:
    """What of an order a resume must find unchanged: not the ranks (a run resumes on any
    number), only the global batch they make; under a ramp not the schedule either, whose
    own resume accepts changes to steps not taken and refuses the rest, naming the step."""
    (kind, config), = order.items()
    config = dict(config)
    config.pop("rank", None)
    if kind == "ramp":
        config.pop("ranks", None)
        config.pop("schedule", None)
    else:
        config["global"] = config.pop("batch", 1) * config.pop("ranks", 1)
    return {kind: config}


def _manifest(description: Mapping[str, Any], step: int) -> list[dict]:
    import json  # noqa: PLC0415

    rows = _zrecord.explain(json.dumps(description), int(step))
    names = [d.get("name", str(k)) for k, d in enumerate(description.get("datasets", []))]
    return [
        {"rank": rank, "slot": slot, "dataset": names[d] if d < len(names) else d, "record": record, "replaced": replaced, "epoch": epoch}
        for rank, slot, d, record, replaced, epoch in rows
    ]


def _dataset_entry(ds: Any, k: int) -> dict:
    """What a run description says of dataset ``ds``: its name, where it is, its packing."""
    entry: dict[str, Any] = {"name": f"dataset-{k}"}
    opener = getattr(ds, "_opener", None)
    stream = ds.stream if isinstance(ds, _observation_types()) else None
    if opener is not None and opener[0] == "cluster":
        entry["path"] = str(opener[1])
        entry["name"] = (opener[5:] or [None])[0] or "default"
    elif opener is not None:
        entry["path"] = str(opener[1])
        entry["name"] = os.path.basename(os.path.normpath(str(opener[1]))) or entry["name"]
    elif stream is not None:
        entry["path"] = str(stream.path)
        entry["name"] = os.path.basename(os.path.normpath(str(stream.path))) or entry["name"]
    if isinstance(ds, _packed_type()):
        entry["packing"] = {"seq_len": ds.seq_len, "packer": ds.packer, "lookahead": ds.lookahead, "seed": ds.seed}
        if ds.blocklist:
            entry["blocked_documents"] = list(ds.blocklist)
    elif stream is not None:
        entry["windows"] = {"documents": {"seq_len": ds.seq_len}} if ds.by_document else {"windows": {"seq_len": ds.seq_len, "stride": ds.stride}}
    return entry


def _identity(ds: Any) -> str | None:
    """A digest of what ``ds`` holds now: a local dataset's commit (meta.json), a stream's
    (stream.json: its tokens, documents, spans and their CRCs), a cluster dataset's (when it
    was made, its committed length, the commits that changed its records, its fields)."""
    import hashlib  # noqa: PLC0415

    opener = getattr(ds, "_opener", None)
    stream = ds.stream if isinstance(ds, _observation_types()) else None
    if stream is not None and getattr(stream, "dataset", None) is not None:
        return _identity(stream.dataset)
    if opener is not None and opener[0] == "cluster":
        import json  # noqa: PLC0415

        name = (list(opener) + [None] * 7)[5] or "default"
        try:
            listed = next((d for d in ds.datasets() if d["name"] == name), None)
        except (OSError, RuntimeError, ValueError):
            return None  # a cluster that cannot list its datasets now: nothing to check
        if listed is None or listed["commits"] is None:
            return None
        held = {key: listed[key] for key in ("name", "id", "committed", "commits", "fields")}
        return hashlib.sha256(json.dumps(held, sort_keys=True, default=str).encode()).hexdigest()[:32]
    if opener is not None and opener[0] == "local":
        path = os.path.join(str(opener[1]), "meta.json")
    elif stream is not None and getattr(stream, "dataset", None) is None:
        path = os.path.join(str(stream.path), "stream.json")
    else:
        return None
    import pathlib  # noqa: PLC0415 - this module's `open` is the dataset opener

    try:
        return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()[:32]
    except OSError:
        return None


def _observation_types() -> tuple[type, ...]:
    from .stream import Packed, Windows  # noqa: PLC0415

    return (Packed, Windows)


def _packed_type() -> type:
    from .stream import Packed  # noqa: PLC0415

    return Packed


def _cu_seqlens(segment_ids: np.ndarray) -> tuple[np.ndarray, int]:
    """The sequences of packed rows' inputs (``[:, :-1]``) flattened, from their segment ids:
    each run of one id in a row a sequence (padding, id 0, one too)."""
    inputs = np.ascontiguousarray(segment_ids[:, :-1])
    rows, width = inputs.shape
    flat = inputs.reshape(-1)
    starts = np.ones(flat.size, dtype=np.bool_)
    starts[1:] = flat[1:] != flat[:-1]
    starts[::width] = True
    cu = np.append(np.flatnonzero(starts), flat.size).astype(np.int32)
    return cu, int(np.diff(cu).max(initial=0))


def _mixture_fields(datasets: list[Dataset], mixture: Mixture, fields: Sequence[str] | None) -> list[Field]:
    """The fields a loader over ``mixture`` reads from ``datasets``, checked: one dataset per
    source, each as long as the mixture has it, each holding every field alike."""
    lengths = mixture.config["lengths"]
    if len(datasets) != len(lengths):
        raise ValueError(f"the mixture has {len(lengths)} datasets and the loader was given {len(datasets)}")
    for i, (ds, n) in enumerate(zip(datasets, lengths)):
        if len(ds) != n:
            raise ValueError(f"dataset {i} holds {len(ds)} records and the mixture has it at {n}")
    names = _names_of(fields) if fields is not None else [f.name for f in datasets[0].fields]
    chosen = []
    for name in names:
        first = None
        for i, ds in enumerate(datasets):
            if all(f.name != name for f in ds.fields):
                raise KeyError(f"dataset {i} has no field '{name}' (it has: {', '.join(f.name for f in ds.fields)})")
            f = ds._field(name)
            if first is None:
                first = f
            elif (f.dtype, f.shape) != (first.dtype, first.shape):
                raise ValueError(f"field '{name}' is {f.dtype}{list(f.shape or [])} in dataset {i} and {first.dtype}{list(first.shape or [])} in dataset 0: a batch needs one kind")
        chosen.append(first)
    return chosen


from .stream import Packed, Stream, Windows, create_stream, open_stream, tokenize_jsonl  # noqa: E402  (uses the helpers above)
from .arrow import arrow_fields, from_arrow  # noqa: E402
