"""Arrow tables into zrecord datasets without a per-row loop: a pyarrow ``Table``, a
``RecordBatchReader`` or a Hugging Face ``datasets.Dataset`` (its Arrow table), a record
batch at a time, each column a field — as ``zr convert --parquet`` takes Parquet files.

- binary and string columns (also large and fixed-size) become bytes, a null an absent
  value; their values buffer is handed over as it lies in Arrow's memory;
- numbers, booleans aside, and fixed-size lists of numbers become typed fields of their
  dtype and shape (a null is refused, naming the row);
- Hugging Face image and audio structs (``{bytes, path}``) become their bytes;
- any other type is refused by name.
"""

from __future__ import annotations

import os
from typing import Any, Iterator, Sequence

import numpy as np

__all__ = ["from_arrow", "arrow_fields"]


def _pa() -> Any:
    try:
        import pyarrow  # noqa: PLC0415
    except ImportError as e:  # pragma: no cover - pyarrow is what the caller hands us
        raise ImportError("from_arrow needs pyarrow (pip install pyarrow)") from e
    return pyarrow


def _batches(data: Any, columns: Sequence[str] | None) -> tuple[Any, Iterator[Any]]:
    """(schema, record batches) of a Table, a RecordBatchReader, a RecordBatch or a Hugging
    Face Dataset."""
    pa = _pa()
    table = getattr(getattr(data, "data", None), "table", None)  # datasets.Dataset
    if table is not None:
        data = table
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    if isinstance(data, pa.Table):
        if columns is not None:
            data = data.select(list(columns))
        return data.schema, iter(data.to_batches())
    if isinstance(data, pa.RecordBatchReader):
        schema = data.schema
        if columns is not None:
            missing = [c for c in columns if c not in schema.names]
            if missing:
                raise ValueError(f"no column '{missing[0]}' (it has: {', '.join(schema.names)})")
            schema = pa.schema([schema.field(c) for c in columns])
            return schema, (batch.select(list(columns)) for batch in data)
        return schema, iter(data)
    raise TypeError(f"from_arrow takes a pyarrow Table, RecordBatch or RecordBatchReader, or a Hugging Face Dataset, not {type(data).__name__}")


def _kind(name: str, typ: Any) -> tuple[str, Any, tuple]:
    """How column ``name`` of Arrow type ``typ`` is stored: ("bytes", None, ()) or
    ("typed", dtype, shape), or ("struct", None, ()) for an image/audio struct's bytes."""
    pa = _pa()
    t = pa.types
    if t.is_binary(typ) or t.is_string(typ) or t.is_large_binary(typ) or t.is_large_string(typ) or t.is_fixed_size_binary(typ):
        return ("bytes", None, ())
    if (t.is_integer(typ) or t.is_floating(typ)) and not t.is_boolean(typ):
        return ("typed", np.dtype(typ.to_pandas_dtype()), ())
    if t.is_fixed_size_list(typ) and (t.is_integer(typ.value_type) or t.is_floating(typ.value_type)):
        return ("typed", np.dtype(typ.value_type.to_pandas_dtype()), (typ.list_size,))
    if t.is_struct(typ) and typ.get_field_index("bytes") >= 0:
        inner = typ.field(typ.get_field_index("bytes")).type
        if t.is_binary(inner) or t.is_large_binary(inner):
            return ("struct", None, ())
    raise ValueError(f"column '{name}' is {typ}, which no field type holds (binary, string, numbers, fixed-size lists of numbers, or an image/audio struct with bytes)")


def arrow_fields(schema: Any, compress: str = "raw") -> list[tuple]:
    """The fields a dataset needs to take tables of ``schema``, as ``create`` and
    ``create_dataset`` take them: (name, compress, dtype, shape) per column."""
    out = []
    for field in schema:
        kind, dtype, shape = _kind(field.name, field.type)
        if kind == "typed":
            out.append((field.name, "raw", dtype, list(shape)))
        else:
            out.append((field.name, compress, None, None))
    return out


def _bytes_column(name: str, array: Any) -> tuple[np.ndarray, np.ndarray]:
    """A binary-like Arrow array as (values, offsets): the values buffer as it lies (a view),
    offsets as int64 from 0; a null becomes an absent (empty) value."""
    pa = _pa()
    if isinstance(array, pa.ChunkedArray):
        array = pa.concat_arrays(array.chunks) if array.num_chunks != 1 else array.chunk(0)
    if pa.types.is_struct(array.type):
        child = array.field("bytes")
        if array.null_count:
            # A null struct's bytes are absent whatever its child holds.
            child = pa.compute.if_else(array.is_valid(), child, pa.scalar(None, child.type))
        array = child
    n = len(array)
    if pa.types.is_fixed_size_binary(array.type):
        width = array.type.byte_width
        buffer = array.buffers()[1]
        values = np.frombuffer(buffer, dtype=np.uint8)[array.offset * width : (array.offset + n) * width]
        offsets = np.arange(n + 1, dtype=np.int64) * width
    else:
        large = pa.types.is_large_binary(array.type) or pa.types.is_large_string(array.type)
        _, off_buffer, data_buffer = array.buffers()
        offsets = np.frombuffer(off_buffer, dtype=np.int64 if large else np.int32)[array.offset : array.offset + n + 1].astype(np.int64)
        values = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.empty(0, np.uint8)
    if array.null_count:
        valid = np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        lengths = np.diff(offsets)
        if (lengths[~valid] != 0).any():
            # Nulls over bytes: the valid values are gathered (a copy), the nulls left empty.
            keep = np.repeat(valid, lengths)
            values = values[offsets[0] : offsets[-1]][keep]
            lengths = np.where(valid, lengths, 0)
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            return values, offsets
    first = int(offsets[0])
    return values[first : int(offsets[-1])], offsets - first


def _typed_column(name: str, array: Any, dtype: np.dtype, shape: tuple, row_base: int) -> tuple[np.ndarray, np.ndarray]:
    pa = _pa()
    if isinstance(array, pa.ChunkedArray):
        array = pa.concat_arrays(array.chunks) if array.num_chunks != 1 else array.chunk(0)
    if array.null_count:
        row = int(np.flatnonzero(~np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=bool))[0])
        raise ValueError(f"row {row_base + row} of column '{name}' is null, and a typed field needs a value in every record")
    flat = array.flatten() if shape else array
    if shape and flat.null_count:
        raise ValueError(f"column '{name}' holds a null inside a list, and a typed field needs every value")
    values = flat.to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    width = int(np.prod(shape)) * dtype.itemsize if shape else dtype.itemsize
    return values.reshape(-1).view(np.uint8), np.arange(len(array) + 1, dtype=np.int64) * width


def from_arrow(data: Any, dest: Any, columns: Sequence[str] | None = None, compress: str = "raw") -> Any:
    """Writes ``data`` — a pyarrow ``Table``, ``RecordBatch`` or ``RecordBatchReader``, or a
    Hugging Face ``datasets.Dataset`` — into ``dest``, a record batch at a time, and commits:

    - ``dest`` a path: a new local dataset there (its fields from the columns; byte
      fields stored as ``compress``), returned open read-only; a failed conversion leaves
      nothing there;
    - ``dest`` a writable ``Dataset`` (a local one opened writable, or a cluster's, e.g.
      ``admin.create_dataset(name, zrecord.arrow_fields(table.schema))``): appended to,
      each column to the field of its name; returned.

    ``columns`` picks and orders the columns (default: all)."""
    from .dataset import Dataset, create, open as open_dataset  # noqa: PLC0415

    schema, batches = _batches(data, columns)
    kinds = [(field.name, *_kind(field.name, field.type)) for field in schema]
    made = None
    if isinstance(dest, Dataset):
        target = dest
        have = {f.name for f in target.fields}
        missing = [name for name, *_ in kinds if name not in have]
        if missing:
            raise ValueError(f"the dataset has no field '{missing[0]}' for column '{missing[0]}' (it has: {', '.join(sorted(have))})")
    else:
        made = os.fspath(dest)
        target = create(made, arrow_fields(schema, compress))
    try:
        rows = 0
        for batch in batches:
            if batch.num_rows == 0:
                continue
            data_columns = {}
            for k, (name, kind, dtype, shape) in enumerate(kinds):
                column = batch.column(k)
                if kind == "typed":
                    data_columns[name] = _typed_column(name, column, dtype, shape, rows)
                else:
                    data_columns[name] = _bytes_column(name, column)
            target._native().append_columns(data_columns)
            rows += batch.num_rows
        target.commit()
    except BaseException:
        if made is not None:
            import shutil  # noqa: PLC0415

            target.close()
            shutil.rmtree(made, ignore_errors=True)
        raise
    if made is not None:
        target.close()
        return open_dataset(made)
    return target
