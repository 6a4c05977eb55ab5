"""PyTorch adapters, duck-typed (PyTorch is not imported here).

``MapDataset(ds)`` is a map-style dataset whose ``__getitems__`` gathers a whole batch at
once (``torch.utils.data.DataLoader`` calls it with the batch's indices). ``StatefulSampler``
is a batch-index sampler with ``state_dict()``/``load_state_dict()`` that torchdata's
``StatefulDataLoader`` checkpoints. Both pickle as the dataset's path, so workers forked by
``DataLoader(num_workers > 0)`` reopen the dataset in their own process.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import numpy as np

from . import Dataset, Sampler


class MapDataset:
    """``ds`` as a map-style dataset: ``ds[i]`` per record, ``__getitems__`` per batch."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict:
        return self.dataset[index]

    def __getitems__(self, indices: Sequence[int]) -> list[dict]:
        return self.dataset.__getitems__(indices)


class StatefulSampler:
    """Yields each batch's index list from a ``zrecord.Sampler``; its ``state_dict()`` is the
    position after the last batch handed out (pass it as ``batch_sampler``)."""

    def __init__(self, sampler: Sampler):
        self.sampler = sampler

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.sampler:
            yield batch.tolist()

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)


def collate_columns(records: list[dict]) -> dict:
    """Stacks records' fixed-size fields into arrays and keeps variable ones as lists."""
    out = {}
    for name in records[0]:
        values = [r[name] for r in records]
        out[name] = np.stack(values) if isinstance(values[0], np.ndarray) else values
    return out
