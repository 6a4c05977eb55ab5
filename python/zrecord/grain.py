"""A Grain ``RandomAccessDataSource``, duck-typed (Grain is not imported here):
``__len__``, ``__getitem__``, and batched ``_getitems``/``__getitems__`` that gather a whole
batch at once. It pickles as the dataset's path, so Grain's worker processes reopen it."""

from __future__ import annotations

from typing import Sequence

from . import Dataset


class DataSource:
    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict:
        return self.dataset[index]

    def __getitems__(self, indices: Sequence[int]) -> list[dict]:
        return self.dataset.__getitems__(indices)

    _getitems = __getitems__

    def __repr__(self) -> str:
        return f"zrecord.grain.DataSource({self.dataset!r})"
