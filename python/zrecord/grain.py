"""A Grain ``RandomAccessDataSource``, duck-typed (Grain is not imported here):
``__len__``, ``__getitem__``, and batched ``_getitems``/``__getitems__`` that gather a whole
batch at once. It pickles as the dataset's path, so Grain's worker processes reopen it."""

from __future__ import annotations

from .torch import MapDataset


class DataSource(MapDataset):
    """``dataset`` as a Grain data source: the map dataset's protocol, and Grain's name for
    the batched read."""

    _getitems = MapDataset.__getitems__

    def __repr__(self) -> str:
        return f"zrecord.grain.DataSource({self.dataset!r})"
