"""Token streams: one long sequence of tokens cut into documents, read as windows.

``zrecord.create_stream(path, dtype=np.uint32)`` makes one; ``append_document(tokens,
spans=[(start, end, metadata_bytes), ...])`` and ``commit()`` fill it (or ``zr convert
--megatron PREFIX DIR`` from a Megatron-LM ``.bin/.idx``). ``zrecord.open_stream(path)``
reads it: ``len(stream)`` tokens, ``stream.documents`` of them, and
``stream.windows(seq_len=2048)``: observation i is tokens ``[i*stride, i*stride + seq_len +
1)`` (inputs and labels shifted by one), computed at read time, so ``seq_len`` is chosen when
reading, not when converting. ``stream.document_windows(seq_len)`` has one observation per
document instead, cut or padded to ``seq_len + 1`` with a mask.

Windows are a dataset like any other: ``len(w)``, ``w.gather(indices, out=None)``,
``w[i]``, samplers, ``zrecord.Loader``, ``zrecord.torch.MapDataset`` and
``zrecord.grain.DataSource`` take them. A gather returns ``tokens`` (B, seq_len + 1) of the
stream's dtype, ``document`` (B, seq_len + 1) int64 — each token's document, for document
masking and position ids that restart — ``mask`` in document mode, and, when the stream has
spans, ``spans`` (K, 4) int64 rows of (row, start, end, span) within the window,
``span_ids`` (the spans hit, ascending) and ``metadata`` (their bytes, one per id).

A cluster holds streams too (``zrecord.connect(...).create_stream(name)``,
``zrecord.open_stream(zrecord.connect(..., dataset=name))``): a named dataset of blocks of
tokens, placed, replicated and moved as records are, each window read as the blocks under it
and joined in order. A cluster's streams have plain uint16/uint32 tokens and windows (no
spans, no document windows).
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from . import _zrecord

__all__ = ["Stream", "Windows", "create_cluster_stream", "create_stream", "open_stream"]

_FIELDS = ("tokens", "document", "mask")


def _element_of(dtype: Any) -> list[tuple[str, str]]:
    dtype = np.dtype(dtype)
    if dtype.names:
        return [(name, dtype.fields[name][0].str) for name in dtype.names]
    return [("token", dtype.str)]


def _dtype_of(element: list[tuple[str, str]]) -> np.dtype:
    if len(element) == 1:
        return np.dtype(element[0][1])
    return np.dtype([(name, dtype) for name, dtype in element])


def _field_named(fields: Sequence[Any], name: str, what: str) -> Any:
    """The field ``name`` of ``fields``; a KeyError naming the ones there are otherwise."""
    for f in fields:
        if f.name == name:
            return f
    names = ", ".join(f.name for f in fields)
    raise KeyError(f"{what} have no field '{name}' (they have: {names})")


class Stream:
    """A token stream (see the module documentation). Read-only handles see the stream as
    of a commit: the last one when opened, and again at ``len()`` or ``refresh()``."""

    def __init__(self, native: Any, path: str, writable: bool, dataset: Any = None):
        self._handle = native
        self.path = path
        self.writable = writable
        self.dataset = dataset  # a cluster's: the dataset holding the stream
        self.dtype = _dtype_of(native.element())

    def _native(self) -> Any:
        if self._handle is None:
            raise ValueError(f"the stream {self.path} is closed")
        return self._handle

    def close(self) -> None:
        self._handle = None

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None and self.writable and self._handle is not None:
            self.commit()
        self.close()

    def __getstate__(self) -> dict:
        if self.writable:
            raise TypeError("a writable stream cannot be pickled: open it read-only in the worker")
        return {"path": self.path, "dataset": self.dataset}

    def __setstate__(self, state: dict) -> None:
        if state.get("dataset") is not None:
            reopened = open_stream(state["dataset"])
            self.__init__(reopened._handle, reopened.path, False, state["dataset"])
        else:
            self.__init__(_zrecord.Stream.open(state["path"], False), state["path"], False)

    def __repr__(self) -> str:
        if self._handle is None:
            return f"Stream({self.path!r}, closed)"
        return f"Stream({self.path!r}, {len(self)} tokens, {self.documents} documents, dtype={self.dtype})"

    def refresh(self) -> int:
        """Sees what was committed since; returns the tokens."""
        return self._native().refresh()

    def __len__(self) -> int:
        native = self._native()
        if not self.writable:
            native.refresh()
        return len(native)

    @property
    def documents(self) -> int:
        return self._native().documents()

    @property
    def spans(self) -> int:
        return self._native().spans()

    def document(self, d: int) -> np.ndarray:
        """Document ``d``'s tokens."""
        native = self._native()
        start, end = native.document(int(d))
        return self.tokens(start, end)

    def tokens(self, start: int, end: int) -> np.ndarray:
        """Tokens ``[start, end)`` as an array of the stream's dtype."""
        out = np.empty(max(0, int(end) - int(start)), dtype=self.dtype)
        self._native().read_tokens(int(start), out.view(np.uint8).reshape(-1))
        return out

    def span(self, j: int) -> tuple[int, int, bytes]:
        """Span ``j``: (start, end, metadata)."""
        start, end, metadata = self._native().span(int(j))
        return start, end, bytes(metadata)

    def append_document(self, tokens: Any, spans: Iterable[tuple[int, int, Any]] = ()) -> int:
        """Appends a document of ``tokens`` (of the stream's dtype, or integers that fit it)
        with ``spans``: (start, end, metadata bytes) within the document. Returns its index;
        visible at ``commit()``."""
        array = np.asarray(tokens)
        if array.dtype != self.dtype:
            if self.dtype.names or not np.issubdtype(array.dtype, np.integer):
                raise TypeError(f"tokens must be {self.dtype}, not {array.dtype}")
            info = np.iinfo(self.dtype)
            if array.size and (array.min() < info.min or array.max() > info.max):
                raise ValueError(f"tokens do not fit {self.dtype}")
            array = array.astype(self.dtype)
        flat = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        prepared = []
        for start, end, metadata in spans:
            if isinstance(metadata, str):
                metadata = metadata.encode()
            prepared.append((int(start), int(end), bytes(metadata)))
        return self._native().append_document(flat, prepared)

    def commit(self) -> None:
        self._native().commit()

    def verify(self) -> list[tuple[str, int, str]]:
        """Every problem found (table, entry, reason); empty when the stream is whole."""
        return self._native().verify()

    def windows(self, seq_len: int, stride: int | None = None, read: str = "mmap", uncached: bool = False, checked: bool = False) -> "Windows":
        """Windows of ``seq_len + 1`` tokens every ``stride`` (default ``seq_len``); the last
        incomplete window is dropped. ``read="direct"`` reads them from the disk (each page
        checked against its CRC; ``uncached`` bypasses the page cache), ``"auto"`` chooses by
        what is in memory; ``checked`` checks pages read through the mapping too."""
        stride = seq_len if stride is None else stride
        return Windows(self, int(seq_len), int(stride), False, read, uncached, checked)

    def packed(self, seq_len: int, lookahead: int = 1024, packer: str = "best_fit", seed: int = 0, read: str = "mmap", uncached: bool = False, checked: bool = False, blocklist: Sequence[int] = ()) -> "Packed":
        """The stream's documents packed whole into rows of ``seq_len + 1`` tokens, in the
        order ``seed`` shuffles them into: ``best_fit`` places ``lookahead`` documents at a
        time, longest first, each into the row with the least room that holds it;
        ``first_fit`` places them in order, each into the first row that holds it. A
        document longer than a row is cut into full rows, its remainder packed like any
        document. Rows are an index space like windows: samplers, mixtures and loaders
        read them, with exact resume.

        ``blocklist`` names documents not to read: a row that held a piece of one reads its
        other pieces moved up and more padding; every other row stays as it was, and so
        does every row's place in the run (a document the stream lacks is refused)."""
        return Packed(self, seq_len, packer, lookahead, seed, read, uncached, checked, blocklist)

    def document_windows(self, seq_len: int, read: str = "mmap", uncached: bool = False, checked: bool = False) -> "Windows":
        """One observation per document: its first ``seq_len + 1`` tokens, padded with zeros
        (``mask`` 0, ``document`` -1) when shorter."""
        return Windows(self, int(seq_len), 1, True, read, uncached, checked)


class Packed:
    """A stream's documents packed whole into rows, as a dataset: see ``Stream.packed``."""

    def __init__(self, stream: Stream, seq_len: int, packer: str = "best_fit", lookahead: int = 1024, seed: int = 0, read: str = "mmap", uncached: bool = False, checked: bool = False, blocklist: Sequence[int] = ()):
        if int(seq_len) < 1:
            raise ValueError(f"seq_len must be at least 1, not {seq_len}")
        if int(lookahead) < 1:
            raise ValueError(f"a lookahead of {lookahead} documents places none: give at least 1")
        self.stream = stream
        self.seq_len = int(seq_len)
        self.packer = packer
        self.lookahead = int(lookahead)
        self.seed = int(seed)
        #: Documents not read (see ``Stream.packed``).
        self.blocklist = sorted({int(d) for d in blocklist})
        self._args = (self.seq_len, packer, self.lookahead, self.seed, read, uncached, checked, self.blocklist)
        pack = (self.seq_len, packer, self.lookahead, self.seed)
        self._handle = stream._native().packed(pack, (read, uncached, checked), self.blocklist)
        self.width = self.seq_len + 1

    def _native(self) -> Any:
        return self._handle

    def __getstate__(self) -> dict:
        return {"stream": self.stream, "args": self._args}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["stream"], *state["args"])

    def __repr__(self) -> str:
        return f"<{len(self)} rows of {self.width} tokens packed {self.packer} from {self.stream.path}>"

    def __len__(self) -> int:
        """Rows: the plan is made when the packing is, from the documents committed then."""
        return len(self._handle)

    def stats(self) -> dict:
        """What the packing comes to: rows, documents, tokens, documents split, pieces and
        the padding fraction."""
        rows, documents, tokens, split, pieces, padding = self._handle.stats()
        return {"rows": rows, "documents": documents, "tokens": tokens, "split": split, "pieces": pieces, "padding_fraction": padding}

    @property
    def fields(self) -> list:
        """Per token, rows of ``seq_len + 1``: ``tokens`` (the stream's dtype), ``document``
        (int64, -1 on padding), ``segment_ids`` (int32: 1, 2, … per document piece in the
        row, 0 on padding), ``positions`` (int32, from 0 in each piece), ``loss_mask``
        (bool: the next token is the same piece's). Per batch: ``cu_seqlens`` (int32, the
        sequences of the inputs ``tokens[:, :-1]`` flattened, each row's padding one) and
        ``max_seqlen``."""
        from .dataset import Field

        shape = (self.width,)
        return [
            Field("tokens", "raw", self.stream.dtype, shape),
            Field("document", "raw", np.dtype(np.int64), shape),
            Field("segment_ids", "raw", np.dtype(np.int32), shape),
            Field("positions", "raw", np.dtype(np.int32), shape),
            Field("loss_mask", "raw", np.dtype(np.bool_), shape),
            Field("cu_seqlens", "raw", np.dtype(np.int32), None),
            Field("max_seqlen", "raw", np.dtype(np.int32), None),
        ]

    @property
    def _names(self) -> list[str]:
        return [f.name for f in self.fields]

    def _field(self, name: str) -> Any:
        return _field_named(self.fields, name, "packed rows")

    def _finish(self, batch: dict) -> dict:
        """A batch the engine's loader read: the per-batch fields as arrays."""
        if "cu_seqlens" in batch:
            values, _ = batch["cu_seqlens"]
            batch["cu_seqlens"] = values.view(np.int32)
        if "max_seqlen" in batch:
            values, _ = batch["max_seqlen"]
            batch["max_seqlen"] = int(values.view(np.int32)[0])
        return batch

    def gather(self, indices: Any, fields: Sequence[str] | None = None) -> dict:
        """Rows ``indices`` as {"tokens": (B, W+1), "document", "segment_ids", "positions",
        "loss_mask": (B, W+1), "cu_seqlens": (S + 1,) int32, "max_seqlen": int}; ``fields``
        picks among them (default all)."""
        from .dataset import _as_indices

        idx = _as_indices(indices)
        n = len(self._handle)
        if idx.dtype.kind == "i":
            idx = np.where(idx < 0, idx + n, idx)
            if idx.size and idx.min() < 0:
                raise IndexError(f"index {int(np.asarray(indices).reshape(-1)[int(np.argmin(idx))])} is out of range: there are {n} rows")
        idx = idx.astype(np.uint64, copy=False)
        if idx.size and int(idx.max()) >= n:
            raise IndexError(f"index {int(idx.max())} is out of range: there are {n} rows")
        from .dataset import _names_of

        known = self._names
        names = known if fields is None else _names_of(fields)
        for name in names:
            if name not in known:
                raise KeyError(f"packed rows have no field '{name}' (they have: {', '.join(known)})")
        tokens, document, segments, positions, mask, cu_seqlens, max_seqlen = self._handle.gather(idx)
        shape = (idx.size, self.width)
        every = {
            "tokens": tokens.view(self.stream.dtype).reshape(shape),
            "document": document.reshape(shape),
            "segment_ids": segments.reshape(shape),
            "positions": positions.reshape(shape),
            "loss_mask": mask.view(np.bool_).reshape(shape),
            "cu_seqlens": cu_seqlens,
            "max_seqlen": int(max_seqlen),
        }
        return {name: every[name] for name in names}

    def __getitem__(self, index: int) -> dict:
        """Row ``index`` as {field: its row} (``cu_seqlens`` and ``max_seqlen`` of it alone)."""
        if not isinstance(index, (int, np.integer)):
            raise TypeError(f"row indices are integers, not {type(index).__name__}")
        batch = self.gather([int(index)])
        return {name: value[0] if name in _PER_TOKEN else value for name, value in batch.items()}


_PER_TOKEN = ("tokens", "document", "segment_ids", "positions", "loss_mask")


class Windows:
    """Observations of a stream, as a dataset: see ``Stream.windows``."""

    def __init__(self, stream: Stream, seq_len: int, stride: int, documents: bool, read: str = "mmap", uncached: bool = False, checked: bool = False):
        self.stream = stream
        self.seq_len = seq_len
        self.stride = stride
        self.by_document = documents
        self._args = (seq_len, stride, documents, read, uncached, checked)
        self._handle = stream._native().windows((seq_len, stride, documents), (read, uncached, checked))
        self.width = seq_len + 1

    def _native(self) -> Any:
        return self._handle

    def __getstate__(self) -> dict:
        return {"stream": self.stream, "args": self._args}

    def __setstate__(self, state: dict) -> None:
        seq_len, stride, documents, read, uncached, checked = state["args"]
        self.__init__(state["stream"], seq_len, stride, documents, read, uncached, checked)

    def __repr__(self) -> str:
        kind = "document windows" if self.by_document else f"windows (stride {self.stride})"
        return f"<{len(self)} {kind} of {self.width} tokens of {self.stream.path}>"

    def __len__(self) -> int:
        if not self.stream.writable:
            self.stream._native().refresh()
        return len(self._handle)

    @property
    def fields(self) -> list:
        """As a dataset's: ``tokens`` (seq_len + 1 of the stream's dtype), ``document``
        (seq_len + 1 int64) and, for document windows, ``mask`` (seq_len + 1 bool)."""
        from .dataset import Field

        fields = [
            Field("tokens", "raw", self.stream.dtype, (self.width,)),
            Field("document", "raw", np.dtype(np.int64), (self.width,)),
        ]
        if self.by_document:
            fields.append(Field("mask", "raw", np.dtype(np.bool_), (self.width,)))
        return fields

    @property
    def _names(self) -> list[str]:
        return [f.name for f in self.fields]

    def _field(self, name: str) -> Any:
        return _field_named(self.fields, name, "windows")

    def gather(self, indices: Any, fields: Sequence[str] | None = None, out: Mapping[str, Any] | None = None) -> dict:
        """Observations ``indices`` as {"tokens": (B, W+1), "document": (B, W+1) int64,
        ["mask": (B, W+1) bool], ["spans", "span_ids", "metadata"]}. ``fields`` picks among
        tokens, document and mask (default all; spans come with the stream's spans);
        ``out`` gives caller-owned arrays to fill (C-contiguous, of the right dtype and
        shape, e.g. pinned tensors' NumPy views), returned as given."""
        from .dataset import _as_indices, _writable_bytes

        idx = _as_indices(indices)
        if idx.dtype.kind == "i":
            n = len(self._handle)
            idx = np.where(idx < 0, idx + n, idx)
            if idx.size and idx.min() < 0:
                raise IndexError(f"index {int(np.asarray(indices).reshape(-1)[int(np.argmin(idx))])} is out of range: there are {n} windows")
        idx = idx.astype(np.uint64, copy=False)
        known = self._names
        from .dataset import _names_of

        names = list(known) if fields is None else _names_of(fields)
        for name in names:
            if name not in known:
                raise KeyError(f"windows have no field '{name}' (they have: {', '.join(known)})")
        given = dict(out or {})
        for name in given:
            if name not in known:
                raise KeyError(f"out names '{name}', which windows do not have (they have: {', '.join(known)})")
        count = idx.size
        shape = (count, self.width)
        kinds = {"tokens": self.stream.dtype, "document": np.dtype(np.int64), "mask": np.dtype(np.bool_)}
        arrays: dict[str, Any] = {}
        flats: dict[str, np.ndarray] = {}
        for name in _FIELDS:
            if name not in known or (name not in names and name != "tokens" and name not in given):
                continue
            if name in given:
                dest = given[name]
                array = np.asarray(dest) if not hasattr(dest, "numpy") else dest.numpy()
                if tuple(array.shape) != shape or np.dtype(array.dtype) != kinds[name]:
                    raise ValueError(f"out['{name}'] must be {kinds[name]} of shape {shape}, not {array.dtype} of shape {tuple(array.shape)}")
                flats[name] = _writable_bytes(array)
                arrays[name] = dest
            else:
                array = np.empty(shape, dtype=kinds[name])
                flats[name] = array.reshape(-1).view(np.uint8)
                arrays[name] = array
        document = flats["document"].view(np.int64) if "document" in flats else None
        spans = self.stream.spans > 0
        found = self._handle.gather(idx, flats["tokens"], document, flats.get("mask"), spans)
        result = {name: arrays[name] for name in names}
        if spans and found is not None:
            hits, ids, (values, offsets) = found
            result["spans"] = hits.reshape(-1, 4)
            result["span_ids"] = ids.astype(np.int64)
            result["metadata"] = [values[offsets[k] : offsets[k + 1]].tobytes() for k in range(ids.size)]
        return result

    def __getitem__(self, index: int) -> dict:
        """Observation ``index`` as {field: its row}."""
        if not isinstance(index, (int, np.integer)):
            raise TypeError(f"window indices are integers, not {type(index).__name__}")
        batch = self.gather([int(index)])
        return {name: value[0] if name in _FIELDS else value for name, value in batch.items()}

    def __getitems__(self, indices: Sequence[int]) -> list[dict]:
        """Observations ``indices`` as a list of {field: row}: one gather for the batch."""
        batch = self.gather(indices)
        count = _count(indices)
        return [{name: batch[name][k] for name in self._names if name in batch} for k in range(count)]


def _count(indices: Any) -> int:
    return int(np.asarray(indices).reshape(-1).size)


def open_stream(path: Any, writable: bool = False) -> Stream:
    """Opens the token stream at ``path``: read-only (beside other readers and a writer),
    or for appending (one writer at a time). ``path`` may also be a cluster's dataset
    (``zrecord.connect(..., dataset=name)``) holding a stream: its windows are read from the
    cluster's blocks and joined here; appending needs a writer's certificate."""
    from .dataset import Dataset

    if isinstance(path, Dataset):
        client = path._cluster("open_stream()")
        native = _zrecord.ClusterStream.open(client)
        return Stream(native, f"{path._opener[1]}/{client.name()}", writable, path)
    path = os.fspath(path)
    return Stream(_zrecord.Stream.open(path, writable), path, writable)


def create_cluster_stream(dataset: Any, name: str, dtype: Any = np.uint32, block_tokens: int = 16_384) -> Stream:
    """Makes the cluster's dataset ``name`` a token stream of ``dtype`` (uint16 or uint32)
    in blocks of ``block_tokens`` tokens, through ``dataset`` (an operator's connection);
    returns it, open for appending (a writer's certificate)."""
    element = _element_of(dtype)
    if len(element) != 1:
        raise ValueError("a cluster's token streams hold plain uint16 or uint32 tokens")
    native = _zrecord.ClusterStream.create(dataset._cluster("create_stream()"), name, element[0][1], int(block_tokens))
    return Stream(native, f"{dataset._opener[1]}/{name}", True, dataset.dataset(name))


def create_stream(path: str | os.PathLike, dtype: Any = np.uint32) -> Stream:
    """Creates an empty token stream at ``path`` (which must not exist or be empty) of
    ``dtype``: uint16, uint32, or a structured dtype whose first field is the token (e.g.
    ``[("token", "<u4"), ("concept", "<u2")]``). Opened for appending."""
    path = os.fspath(path)
    return Stream(_zrecord.Stream.create(path, _element_of(dtype)), path, True)


def tokenize_jsonl(inputs: Any, tokenizer: Any, dest: Any, text_key: str = "text", eos: str | None = None, append: bool = False, skip_bad: bool = False, threads: int = 0, meta_keys: Sequence[str] = ()) -> dict:
    """Text into the token stream at ``dest``, as ``zr convert --jsonl`` does: JSON lines
    (``.jsonl``, ``.jsonl.gz``, ``.jsonl.zst``; a document a line, its text at
    ``text_key``) or Parquet files (their ``text_key`` column), tokenized with the Hugging
    Face ``tokenizer`` (a tokenizer.json; the library the ``tokenizers`` package is built on,
    so the tokens are the same) on every core (``threads``: 0), natively and without the
    GIL, in the input's order; uint16 tokens when the vocabulary fits, else uint32.
    ``eos`` ends every document with that token; ``meta_keys`` keeps those keys of each line
    as the metadata of a span over its document; ``append`` adds to an existing stream.

    A bad line raises ValueError naming file:line (``skip_bad`` counts and skips it
    instead); a failed conversion leaves no new stream, and an appended one at its last
    commit. Returns {"stream": the stream, opened, "documents", "tokens", "skipped",
    "dtype"}."""
    paths = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
    documents, tokens, skipped, dtype = _zrecord.tokenize_jsonl([os.fspath(p) for p in paths], os.fspath(tokenizer), os.fspath(dest), text_key, eos, bool(append), bool(skip_bad), int(threads), [str(k) for k in meta_keys])
    return {"stream": open_stream(dest), "documents": documents, "tokens": tokens, "skipped": skipped, "dtype": dtype}
