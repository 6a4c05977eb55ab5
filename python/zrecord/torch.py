"""PyTorch adapters, duck-typed (PyTorch is imported only by ``collate``).

``MapDataset(ds)`` is a map-style dataset whose ``__getitems__`` gathers a whole batch at
once (``torch.utils.data.DataLoader`` calls it with the batch's indices) and returns it as a
``Batch``: the gathered arrays whole, and per record on demand. ``collate`` (pass it as the
loader's ``collate_fn``) turns a ``Batch`` into tensors of the whole arrays, with no split
into records and no stacking again; torch's default collate still works on it, record by
record.

``StatefulSampler`` is a batch-index sampler with ``state_dict()``/``load_state_dict()``.
torchdata's ``StatefulDataLoader`` checkpoints it as it is; ``resume(sampler, state)`` takes
such a checkpoint to a loader with another number of workers. A plain ``DataLoader`` takes
batches from it ahead of the training loop (its workers prefetch), so its own position runs
ahead of what the loop consumed: iterate ``sampler.track(loader)`` instead of ``loader``,
and ``state_dict()`` is the state after the last batch the loop received — resuming from it
(with any ``num_workers``) gives exactly the batches an uninterrupted run would have — and
a loop broken off and iterated again goes on after that batch.

Everything pickles as the dataset's path, so workers of ``DataLoader(num_workers > 0)``
(forked or spawned) reopen the dataset in their own process.
"""

from __future__ import annotations

from collections.abc import Sequence as _Sequence
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from .dataset import Dataset
from .sampling import Mixture, Sampler, _mixture_fields


class Batch(_Sequence):
    """A gathered batch: ``columns`` (per field, an array of shape ``(B, *shape)`` or
    ``(values, offsets)``) as ``Dataset.gather`` returns it; as a sequence, its records
    ({field: value}), made only when asked for."""

    def __init__(self, columns: dict, count: int):
        self.columns = columns
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(self.count))]
        if not -self.count <= k < self.count:
            raise IndexError(f"record {k} of a batch of {self.count}")
        k %= self.count
        record = {}
        # Token windows' spans: (row, start, end, span) for the whole batch, with the spans'
        # ids and metadata once per batch (a list): a row takes its own spans only.
        windows = isinstance(self.columns.get("metadata"), list) and "span_ids" in self.columns
        for name, value in self.columns.items():
            if windows and name == "spans":
                record[name] = value[value[:, 0] == k]
            elif windows and name in ("span_ids", "metadata"):
                continue  # once per batch: in ``columns``
            elif isinstance(value, np.ndarray):
                record[name] = value[k]
            else:
                values, offsets = value
                record[name] = values[offsets[k] : offsets[k + 1]].tobytes()
        return record


class MapDataset:
    """``ds`` as a map-style dataset: ``ds[i]`` per record, ``__getitems__`` per batch
    (one gather; a ``Batch``)."""

    def __init__(self, dataset: Dataset, fields: Sequence[str] | None = None):
        self.dataset = dataset
        self.fields = fields

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict:
        return self.dataset[index]

    def __getitems__(self, indices: Sequence[int]) -> Batch:
        count = len(indices)
        return Batch(self.dataset.gather(indices, self.fields), count)


def collate(batch: Any) -> Any:
    """A ``DataLoader`` ``collate_fn``: a ``Batch`` as {field: tensor of the whole batch}
    (a varying-size field as (values, offsets) tensors), taken over from the gathered arrays
    without a copy; anything else through torch's default collate."""
    import torch  # noqa: PLC0415 - optional dependency
    from torch.utils.data import default_collate  # noqa: PLC0415

    if not isinstance(batch, Batch):
        return default_collate(batch)
    out = {}
    for name, value in batch.columns.items():
        if isinstance(value, np.ndarray):
            out[name] = torch.from_numpy(value)
        else:
            values, offsets = value
            out[name] = (torch.from_numpy(values), torch.from_numpy(offsets))
    return out


class StatefulSampler:
    """Yields each batch's index list from a ``zrecord.Sampler`` (pass it as
    ``batch_sampler``); see the module documentation for ``track``."""

    def __init__(self, sampler: Sampler):
        self.sampler = sampler
        # While `track` runs: (epoch, position) after the last batch the loop received.
        self._consumed: tuple[int, int] | None = None
        # The pass handed out last and not finished: (epoch, position it began at, its token).
        self._live: tuple[int, int, object] | None = None

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[list[int]]:
        # A pass asked for while the one before it was handed out and never finished begins
        # where that one began: torchdata, restoring a state taken at an epoch's end, makes
        # a pass it prefetches from and throws away before the real one.
        if self._live is not None:
            self.sampler.epoch, self.sampler.position = self._live[0], self._live[1]
        token = object()
        self._live = (self.sampler.epoch, self.sampler.position, token)
        return self._pass(token)

    def _pass(self, token: object) -> Iterator[list[int]]:
        for batch in self.sampler:
            yield batch.tolist()
        if self._live is not None and self._live[2] is token:
            self._live = None

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)
        self._consumed = None
        self._live = None

    def track(self, loader: Iterable) -> Iterator:
        """Iterates ``loader`` (a ``DataLoader`` over this sampler, in order), counting the
        batches the loop receives: ``state_dict()`` meanwhile, and after the loop ends or
        breaks off, is the state after the last of them, and the next iteration starts
        there."""
        s = self.sampler
        epoch, start = s.epoch, s.position
        per_epoch, size = s.epoch_items(), s.config["batch"]
        self._consumed = (epoch, start)
        finished = False
        try:
            for batch in loader:
                position = min(self._consumed[1] + size, per_epoch)
                self._consumed = (epoch, position)
                yield batch
            finished = True
        finally:
            consumed, self._consumed = self._consumed, None
            self._live = None  # the next pass begins where the loop got to
            if finished:
                s.epoch, s.position = epoch + 1, 0
            else:
                # Batches handed out but not received are handed out again.
                s.epoch, s.position = consumed

    def state_dict(self) -> dict[str, Any]:
        if self._consumed is not None:
            return self.sampler.state_at(*self._consumed)
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)
        self._consumed = None
        self._live = None


class MixtureSampler:
    """A batch sampler over a ``zrecord.Mixture``: each batch this rank's part of the next
    global batch, as (source, index) pairs for a ``MixtureDataset``. It has no end (the
    mixture has none). ``state_dict()`` is the mixture's — the same on every rank — and, as
    with ``StatefulSampler``, ``track(loader)`` makes it the state after the last batch a
    plain ``DataLoader``'s loop received."""

    def __init__(self, mixture: Mixture):
        self.mixture = mixture
        self._consumed: int | None = None

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        while True:
            source, index = self.mixture.batch_at(self.mixture.batches)
            self.mixture.batches += 1
            yield list(zip(source.tolist(), index.tolist()))

    def track(self, loader: Iterable) -> Iterator:
        start = self.mixture.batches
        self._consumed = start
        try:
            for batch in loader:
                self._consumed += 1
                yield batch
        finally:
            consumed, self._consumed = self._consumed, None
            self.mixture.batches = consumed

    def state_dict(self) -> dict[str, Any]:
        state = self.mixture.state_dict()
        if self._consumed is not None:
            state["batches"] = self._consumed
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mixture.load_state_dict(state)
        self._consumed = None


class MixtureDataset:
    """The datasets of a mixture as one map-style dataset whose items are addressed by
    (source, index) pairs (what ``MixtureSampler`` yields): ``__getitems__`` gathers each
    dataset's rows of a batch at once and returns a ``Batch`` with a ``source`` column."""

    def __init__(self, datasets: Sequence[Dataset], mixture: Mixture, fields: Sequence[str] | None = None):
        self.datasets = list(datasets)
        self.fields = [f.name for f in _mixture_fields(self.datasets, mixture, fields)]

    def __getitem__(self, pair: tuple[int, int]) -> dict:
        return self.__getitems__([pair])[0]

    def __getitems__(self, pairs: Sequence[tuple[int, int]]) -> Batch:
        source = np.fromiter((s for s, _ in pairs), dtype=np.int64, count=len(pairs))
        index = np.fromiter((i for _, i in pairs), dtype=np.int64, count=len(pairs))
        return Batch(gather_mixed(self.datasets, self.fields, source, index), len(pairs))


def gather_mixed(datasets: Sequence[Dataset], fields: Sequence[str], source: np.ndarray, index: np.ndarray) -> dict:
    """Rows ``index`` of datasets ``source`` (row by row), gathered per dataset and put back
    in batch order, with the ``source`` column: what a mixture loader yields."""
    count = source.size
    parts = []
    for i in np.unique(source):
        rows = np.flatnonzero(source == i)
        parts.append((rows, datasets[int(i)].gather(index[rows], list(fields))))
    columns: dict[str, Any] = {"source": source}
    for name in fields:
        first = parts[0][1][name] if parts else None
        if isinstance(first, np.ndarray):
            out = np.empty((count, *first.shape[1:]), dtype=first.dtype)
            for rows, got in parts:
                out[rows] = got[name]
            columns[name] = out
            continue
        lengths = np.zeros(count, dtype=np.int64)
        for rows, got in parts:
            lengths[rows] = np.diff(got[name][1])
        offsets = np.zeros(count + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        values = np.empty(int(offsets[-1]), dtype=np.uint8)
        for rows, got in parts:
            part_values, part_offsets = got[name]
            sizes = np.diff(part_offsets)
            within = np.arange(part_values.size) - np.repeat(part_offsets[:-1], sizes)
            values[np.repeat(offsets[rows], sizes) + within] = part_values
        columns[name] = (values, offsets)
    return columns


def resume(sampler: StatefulSampler, loader_state: dict) -> StatefulSampler:
    """Sets ``sampler`` to where a torchdata ``StatefulDataLoader`` was when it took
    ``loader_state`` (its ``state_dict()``), with any number of workers then and now: build
    a new loader over ``sampler`` and do not load the state into it (torchdata refuses a
    state taken with another ``num_workers``). Returns ``sampler``."""
    snapshot = loader_state.get("_snapshot")
    if snapshot is not None:  # taken with workers: the main process's snapshot
        main = snapshot["_main_snapshot"]
        state = dict(main["_index_sampler_state"])
        # Batches yielded since the snapshot (with snapshot_every_n_steps > 1).
        steps = int(loader_state.get("_steps_since_snapshot", 0))
    else:  # taken in a single process
        state = dict(loader_state["_index_sampler_state"])
        steps = 0
    if steps:
        per_epoch = sampler.sampler.epoch_items()
        state["position"] = min(int(state["position"]) + steps * sampler.sampler.config["batch"], per_epoch)
    sampler.load_state_dict(state)
    return sampler


def collate_columns(records: list[dict]) -> dict:
    """Stacks records' fixed-size fields into arrays and keeps variable ones as lists."""
    if isinstance(records, Batch):
        return dict(records.columns)
    out = {}
    for name in records[0]:
        values = [r[name] for r in records]
        out[name] = np.stack(values) if isinstance(values[0], np.ndarray) else values
    return out
