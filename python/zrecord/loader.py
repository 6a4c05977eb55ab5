"""The prefetching loader (``Loader``): batches in the order a sampler gives, gathered ahead
by worker threads, resumed exactly from ``state_dict()``, each step described for provenance."""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from . import _zrecord

from .dataset import Dataset, _names_of, _typed
from .sampling import Mixture, RampSampler, Sampler, _manifest, _mixture_fields


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
