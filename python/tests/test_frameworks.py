"""The adapters with the real frameworks, where they are installed (each test skips
otherwise): PyTorch's DataLoader with workers, forked and spawned, over a dataset written in
the same process; exact resume of a plain DataLoader; gathers into pinned tensors;
torchdata's StatefulDataLoader resumed under another number of workers."""

from __future__ import annotations

import numpy as np
import pytest

import zrecord
from zrecord.torch import MapDataset, StatefulSampler, collate

torch = pytest.importorskip("torch")


def _dataset(path, n=2000):
    with zrecord.create(path, [("x", "raw", "<i8", (2,)), ("name", "flate")]) as ds:
        ds.append_many([{"x": np.array([k, -k], dtype="<i8"), "name": f"r{k}"} for k in range(n)])
    return zrecord.open(path)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_dataloader_with_workers_reads_what_this_process_wrote(tmp_path, context):
    writer = zrecord.create(tmp_path / "ds", [("x", "raw", "<i8", ())])
    writer.append_many([{"x": np.int64(k)} for k in range(1000)])
    writer.commit()  # the writer stays open
    sampler = StatefulSampler(zrecord.Sampler(1000, order="sequential", batch=100))
    loader = torch.utils.data.DataLoader(
        MapDataset(writer), batch_sampler=sampler, num_workers=2, collate_fn=collate, multiprocessing_context=context
    )
    got = torch.cat([batch["x"] for batch in loader])
    assert got.tolist() == list(range(1000))
    writer.close()


def test_a_plain_dataloader_resumes_exactly(tmp_path):
    ds = _dataset(tmp_path / "ds")

    def loader(sampler):
        return torch.utils.data.DataLoader(MapDataset(ds), batch_sampler=sampler, num_workers=2, collate_fn=collate, prefetch_factor=2)

    whole = StatefulSampler(zrecord.Sampler(len(ds), seed=5, batch=64))
    expected = [b["x"][:, 0].tolist() for b in whole.track(loader(whole))]
    assert sorted(sum(expected, [])) == list(range(len(ds)))
    sampler = StatefulSampler(zrecord.Sampler(len(ds), seed=5, batch=64))
    first = []
    for batch in sampler.track(loader(sampler)):
        first.append(batch["x"][:, 0].tolist())
        if len(first) == 7:
            break
    state = sampler.state_dict()
    assert state["position"] == 7 * 64
    resumed = StatefulSampler(zrecord.Sampler(len(ds), seed=5, batch=64))
    resumed.load_state_dict(state)
    rest = [b["x"][:, 0].tolist() for b in resumed.track(loader(resumed))]
    assert first + rest == expected
    # Broken off and iterated again: on from batch 8, not from what the workers prefetched.
    again = [b["x"][:, 0].tolist() for b in sampler.track(loader(sampler))]
    assert first + again == expected


def test_batches_reach_the_loop_whole_and_tensors_are_filled_in_place(tmp_path):
    ds = _dataset(tmp_path / "ds", 300)
    loader = torch.utils.data.DataLoader(MapDataset(ds), batch_size=32, collate_fn=collate)
    batch = next(iter(loader))
    assert batch["x"].shape == (32, 2) and batch["x"].dtype == torch.int64
    values, offsets = batch["name"]
    assert bytes(values[offsets[3] : offsets[4]].numpy()) == b"r3"
    out = torch.empty((3, 2), dtype=torch.int64)
    if torch.cuda.is_available():
        out = out.pin_memory()
    assert ds.gather([7, 0, 299], ["x"], out={"x": out})["x"] is out
    assert out[:, 0].tolist() == [7, 0, 299]
    with pytest.raises(ValueError, match="int64"):
        ds.gather([7], ["x"], out={"x": torch.empty((1, 2), dtype=torch.float32)})


@pytest.mark.parametrize(("before", "after"), [(2, 0), (0, 2), (2, 3)])
def test_a_stateful_dataloader_resumes_under_another_number_of_workers(tmp_path, before, after):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    from zrecord.torch import resume

    ds = _dataset(tmp_path / "ds", 1000)

    def loader(sampler, workers):
        return stateful.StatefulDataLoader(MapDataset(ds), batch_sampler=sampler, num_workers=workers, collate_fn=collate)

    expected = [b["x"][:, 0].tolist() for b in loader(StatefulSampler(zrecord.Sampler(1000, seed=2, batch=50)), 0)]
    first_loader = loader(StatefulSampler(zrecord.Sampler(1000, seed=2, batch=50)), before)
    it = iter(first_loader)
    first = [next(it)["x"][:, 0].tolist() for _ in range(7)]
    state = first_loader.state_dict()
    del it
    sampler = resume(StatefulSampler(zrecord.Sampler(1000, seed=2, batch=50)), state)
    rest = [b["x"][:, 0].tolist() for b in loader(sampler, after)]
    assert first + rest == expected


def test_a_stateful_dataloader_over_a_mixture_resumes_on_other_ranks_and_workers(tmp_path):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    from zrecord.torch import MixtureDataset, MixtureSampler

    datasets = []
    for i, n in enumerate((300, 80)):
        with zrecord.create(tmp_path / f"m{i}", [("x", "raw", "<i8", ())]) as ds:
            ds.append_many([{"x": np.int64(1000 * i + k)} for k in range(n)])
        datasets.append(zrecord.open(tmp_path / f"m{i}"))

    def loader(rank, ranks, workers):
        mixture = zrecord.Mixture([300, 80], [0.7, 0.3], seed=1, rank=rank, ranks=ranks, batch=12 // ranks)
        sampler = MixtureSampler(mixture)
        return sampler, stateful.StatefulDataLoader(
            MixtureDataset(datasets, mixture), batch_sampler=sampler, num_workers=workers, collate_fn=collate
        )

    _, whole_loader = loader(0, 1, 0)
    it = iter(whole_loader)
    whole = [next(it)["x"].tolist() for _ in range(15)]
    # Rank 1 of 2, two workers, for 6 global batches.
    _, first_loader = loader(1, 2, 2)
    it = iter(first_loader)
    first = [next(it)["x"].tolist() for _ in range(6)]
    assert first == [b[6:] for b in whole[:6]]
    state = first_loader.state_dict()["_snapshot"]["_main_snapshot"]["_index_sampler_state"]
    assert state["batches"] == 6
    # On one rank with no workers: the rest of the same global batches.
    sampler, rest_loader = loader(0, 1, 0)
    sampler.load_state_dict(state)
    it = iter(rest_loader)
    assert [next(it)["x"].tolist() for _ in range(9)] == whole[6:]


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_a_stateful_dataloader_restored_at_an_epochs_end_reads_the_next_epoch_whole(tmp_path, workers):
    # torchdata restores the finished iterator and prefetches from it before it starts the
    # next one: that pass once advanced the sampler, and the next epoch came 96 of 100.
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    ds = _dataset(tmp_path / "ds", 1000)

    def loader(sampler):
        return stateful.StatefulDataLoader(MapDataset(ds), batch_sampler=sampler, num_workers=workers, collate_fn=collate)

    first = loader(StatefulSampler(zrecord.Sampler(1000, seed=2, batch=10)))
    assert sum(1 for _ in first) == 100
    state = first.state_dict()
    uninterrupted = [b["x"][:, 0].tolist() for b in first]
    restored = loader(StatefulSampler(zrecord.Sampler(1000, seed=2, batch=10)))
    restored.load_state_dict(state)
    again = [b["x"][:, 0].tolist() for b in restored]
    assert len(again) == 100
    assert again == uninterrupted
