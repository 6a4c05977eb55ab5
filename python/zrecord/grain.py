"""Grain adapters, duck-typed (Grain is imported only by ``batches``).

``DataSource(ds)`` is a ``RandomAccessDataSource`` of records: ``__len__``, ``__getitem__``,
and the batched ``_getitems``. Grain's ``batch()`` reads its parent record by record,
though, so for whole batches use ``batches(ds, sampler)``: a ``grain.MapDataset`` whose
element k is the k-th batch of ``sampler``'s order, gathered at once (``BatchSource``
underneath); ``MixtureSource`` does the same for a ``Mixture``'s global batches. Iterators
of them checkpoint with Grain's ``get_state``/``set_state``, and
everything pickles as the dataset's path, so Grain's worker processes reopen it.
"""

from __future__ import annotations

from typing import Any, Sequence

from .dataset import Dataset
from .sampling import Mixture, Sampler, _mixture_fields
from .torch import MapDataset, gather_mixed


class DataSource(MapDataset):
    """``dataset`` as a Grain data source of records: the map dataset's protocol, and
    Grain's name for the batched read."""

    _getitems = MapDataset.__getitems__

    def __repr__(self) -> str:
        return f"zrecord.grain.DataSource({self.dataset!r})"


class BatchSource:
    """A random-access source of whole batches: element k is batch k of ``sampler``'s
    order from its current epoch on (``epochs`` of them), each gathered at once as
    {field: array} — what ``Dataset.gather`` returns."""

    def __init__(self, dataset: Dataset, sampler: Sampler, epochs: int = 1, fields: Sequence[str] | None = None):
        self.dataset = dataset
        self.sampler = sampler
        self.epochs = int(epochs)
        self.fields = fields
        self._first_epoch = sampler.epoch
        self._per_epoch = len(sampler)

    def __len__(self) -> int:
        return self._per_epoch * self.epochs

    def __getitem__(self, k: int) -> dict:
        k = int(k)
        if not 0 <= k < len(self):
            raise IndexError(f"batch {k} of {len(self)}")
        epoch, batch = divmod(k, self._per_epoch)
        size = self.sampler.config["batch"]
        indices = self.sampler.batch_at(self._first_epoch + epoch, batch * size)
        return self.dataset.gather(indices, self.fields)

    def __repr__(self) -> str:
        return f"zrecord.grain.BatchSource({self.dataset!r}, {len(self)} batches)"


class MixtureSource:
    """A random-access source of a mixture's global batches: element k is this rank's part
    of global batch ``mixture.batches + k`` (``count`` of them), each dataset's rows gathered
    at once, with a ``source`` column."""

    def __init__(self, datasets: Sequence[Dataset], mixture: Mixture, count: int, fields: Sequence[str] | None = None):
        self.datasets = list(datasets)
        self.mixture = mixture
        self.count = int(count)
        self.fields = [f.name for f in _mixture_fields(self.datasets, mixture, fields)]
        self._first = mixture.batches

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, k: int) -> dict:
        k = int(k)
        if not 0 <= k < self.count:
            raise IndexError(f"batch {k} of {self.count}")
        return gather_mixed(self.datasets, self.fields, *self.mixture.batch_at(self._first + k))

    def __repr__(self) -> str:
        return f"zrecord.grain.MixtureSource({len(self.datasets)} datasets, {self.count} batches)"


def batches(dataset: Dataset, sampler: Sampler, epochs: int = 1, fields: Sequence[str] | None = None) -> Any:
    """A ``grain.MapDataset`` of whole batches (see ``BatchSource``): e.g.
    ``batches(ds, zrecord.Sampler(len(ds), seed=0, rank=r, ranks=n, batch=256)).to_iter_dataset()``."""
    import grain  # noqa: PLC0415 - optional dependency

    return grain.MapDataset.source(BatchSource(dataset, sampler, epochs, fields))
