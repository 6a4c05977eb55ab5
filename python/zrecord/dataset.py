"""Datasets: local (``open``, ``create``, ``from_numpy``) and a cluster's (``connect``), their
fields, gathers into NumPy arrays and writes."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

import numpy as np

from . import _zrecord

if TYPE_CHECKING:
    from .stream import Stream


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
