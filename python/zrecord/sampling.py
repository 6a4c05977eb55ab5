"""Samplers: a dataset's order per epoch (``Sampler``), mixtures of datasets (``Mixture``),
ramped batch sizes (``RampSampler``) and token budgets (``TokenBudget``), each resuming
exactly from its ``state_dict()``."""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from . import _zrecord

from .dataset import Dataset, Field, _names_of


class Sampler:
    """Batches of indices for one rank: ``order`` "sequential", "shuffle" (a seeded
    permutation per epoch), "random" (with replacement) or "sliding" (windows); every rank of
    ``ranks`` gets as many batches, with no communication (records left over by the split are
    left out of the epoch, with a warning saying how many); ``drop_last`` drops each epoch's
    last, partial batch. Iterating yields the rest of the
    current epoch; ``set_epoch`` moves to another. ``state_dict()`` / ``load_state_dict()``
    resume exactly."""

    def __init__(self, length: int, order: str = "shuffle", seed: int = 0, rank: int = 0, ranks: int = 1, batch: int = 1, drop_last: bool = False, window: int = 0, stride: int = 0, blocklist: Sequence[int] = ()):
        blocklist = sorted({int(r) for r in blocklist})
        self.config = dict(length=length, order=order, seed=seed, rank=rank, ranks=ranks, batch=batch, drop_last=drop_last, window=window, stride=stride, blocklist=blocklist)
        # Ranks always get equal shares (the engine leaves the uneven tail out, and says
        # so); `drop_last` drops each epoch's last, partial batch (PyTorch's default keeps it).
        # A blocked record is read nowhere: each position that would read it reads another.
        self._native = _zrecord.Sampler(length, order, seed, rank, ranks, batch, window, stride, blocklist)
        self.epoch = 0
        self.position = 0
        #: Records of each epoch no rank gets (an uneven split across ``ranks``).
        self.left_out = 0
        if order in ("sequential", "shuffle") and ranks > 1:
            self.left_out = int(length) - self._native.items_per_epoch() * int(ranks)
            if self.left_out:
                import warnings  # noqa: PLC0415

                warnings.warn(
                    f"{self.left_out} of {length} records are left out of each epoch, so that each of {ranks} ranks gets {self._native.items_per_epoch()}",
                    stacklevel=2,
                )

    def __getstate__(self) -> dict:
        # Its configuration and place: a worker process (Grain's, PyTorch's) rebuilds it.
        return {"config": self.config, "epoch": self.epoch, "position": self.position}

    def __setstate__(self, state: dict) -> None:
        c = state["config"]
        self.config = dict(c)
        self._native = _zrecord.Sampler(c["length"], c["order"], c["seed"], c["rank"], c["ranks"], c["batch"], c["window"], c["stride"], c.get("blocklist", []))
        self.epoch, self.position = state["epoch"], state["position"]
        self.left_out = 0
        if c["order"] in ("sequential", "shuffle") and c["ranks"] > 1:
            self.left_out = int(c["length"]) - self._native.items_per_epoch() * int(c["ranks"])

    def epoch_items(self) -> int:
        """Indices this rank gets per epoch (whole batches only with ``drop_last``)."""
        items = self._native.items_per_epoch()
        if self.config["drop_last"]:
            items -= items % self.config["batch"]
        return items

    def __len__(self) -> int:
        return -(-self.epoch_items() // self.config["batch"])

    def set_epoch(self, epoch: int) -> None:
        """Starts epoch ``epoch`` from its beginning."""
        self.epoch = int(epoch)
        self.position = 0

    def batch_at(self, epoch: int, position: int) -> np.ndarray:
        """The batch of ``epoch`` starting at ``position`` (in indices)."""
        end = min(position + self.config["batch"], self.epoch_items())
        return self._native.indices(epoch, position, end)

    def __iter__(self) -> Iterator[np.ndarray]:
        per_epoch = self.epoch_items()
        while self.position < per_epoch:
            batch = self.batch_at(self.epoch, self.position)
            self.position += batch.size
            yield batch
        # The next iteration starts the next epoch.
        self.epoch += 1
        self.position = 0

    def state_dict(self) -> dict:
        """Where the run is: the same on every rank (each rank's batch k of an epoch is its
        part of the epoch's global batch k), enough to resume exactly."""
        return self.state_at(self.epoch, self.position)

    def describe(self) -> dict:
        """The order's part of a run's description (``run.json``; see ``Loader.describe``)."""
        c = self.config
        order: dict[str, Any] = {"kind": c["order"]}
        if c["order"] == "sliding":
            order.update(window=c["window"], stride=c["stride"])
        return {
            "format": "zrecord-run",
            "version": 1,
            "order": {"sampler": {"len": c["length"], "order": order, "seed": c["seed"], "rank": 0, "ranks": c["ranks"], "batch": c["batch"], "tail": "drop"}},
            "datasets": [],
            "blocklist": [[0, r] for r in c["blocklist"]],
        }

    def manifest(self, step: int) -> list[dict]:
        """Global batch ``step`` — what every rank reads, in rank order — computed, not
        logged: {"rank", "slot", "dataset", "record", "replaced", "epoch"} per position
        (``epoch``: the dataset's own)."""
        return _manifest(self.describe(), step)

    def skip(self, steps: int) -> None:
        """Counts the next ``steps`` global batches as read, unread (Megatron's
        ``--iterations-to-skip``): the state after is the one a run that read them has."""
        per_epoch = self.epoch_items()
        position = self.position + int(steps) * self.config["batch"]
        while position >= per_epoch:
            position -= per_epoch
            self.epoch += 1
        self.position = position

    def state_at(self, epoch: int, position: int) -> dict:
        """The state at ``position`` of ``epoch`` (the end of an epoch is the next's start)."""
        c = self.config
        if position >= self.epoch_items():
            epoch, position = epoch + 1, 0
        return {
            "seed": c["seed"],
            "epoch": epoch,
            "position": position,
            "global_batches": -(-position // c["batch"]),
            "len": c["length"],
            "ranks": c["ranks"],
            "batch": c["batch"],
            "blocklist": list(c["blocklist"]),
        }

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Resumes from ``state``, taken with these ranks or any others with the same global
        batch (``batch × ranks``): every whole global batch from there on is the one an
        uninterrupted run reads (an epoch's last, partial one splits as evenly as the ranks
        allow). Refused, naming what differs, if it belongs to another configuration."""
        c = self.config
        missing = [k for k in ("seed", "epoch", "position", "len", "ranks") if k not in state]
        if missing:
            raise ValueError(f"not a sampler's state: it lacks {', '.join(missing)} (give what state_dict() returned)")
        epoch, position = int(state["epoch"]), int(state["position"])
        if int(state["ranks"]) != c["ranks"]:
            theirs = state.get("batch")
            if theirs is None:
                raise ValueError(f"the checkpoint was taken with {state['ranks']} ranks and does not say its batch size, so it resumes only under {state['ranks']} ranks; this sampler has {c['ranks']}")
            if int(theirs) * int(state["ranks"]) != c["batch"] * c["ranks"]:
                raise ValueError(f"the checkpoint was taken with a global batch (batch × ranks) of {int(theirs) * int(state['ranks'])}; this sampler has {c['batch'] * c['ranks']}")
            position = int(state["global_batches"]) * c["batch"]
            if position >= self._native.items_per_epoch():
                epoch, position = epoch + 1, 0
        self._native.check_state(state["seed"], epoch, position, state["len"], c["rank"], c["ranks"])
        before = set(state.get("blocklist", []))
        if before - set(c["blocklist"]):
            raise ValueError(f"the checkpoint's blocklist has records this sampler's lacks ({sorted(before - set(c['blocklist']))[:5]}…): positions already read would be read differently")
        added = set(c["blocklist"]) - before
        self.epoch, self.position = epoch, position
        if added:
            # How many positions of the rest of this epoch, over every rank, change.
            ranks = [Sampler(c["length"], c["order"], c["seed"], r, c["ranks"], c["batch"], c["drop_last"], c["window"], c["stride"]) for r in range(c["ranks"])]
            per_epoch = self.epoch_items()
            changed = sum(int(np.isin(s._native.indices(epoch, position, per_epoch), list(added)).sum()) for s in ranks) if position < per_epoch else 0
            import warnings  # noqa: PLC0415

            warnings.warn(f"{len(added)} records added to the blocklist: {changed} positions of the rest of epoch {epoch} read a replacement", stacklevel=2)


class Mixture:
    """Several datasets read by weight as one stream of global batches of ``batch × ranks``
    records, rank ``rank`` taking ``batch`` of each. ``lengths``: each dataset's records;
    ``weights``: their proportions (any non-negative numbers); ``stages``: weights that change
    at global-batch boundaries, ``[(start_batch, weights), ...]`` after the first. Each
    dataset is read without replacement in its own shuffled epochs, continuing across
    epochs and stages. Batches are pairs of int64 arrays ``(source, index)``: which dataset,
    and which of its records. Iterating yields batch after batch (the stream has no end);
    ``state_dict()`` is the same on every rank and resumes under any ``ranks`` that divides
    the same global batch."""

    def __init__(self, lengths: Sequence[int], weights: Sequence[float], seed: int = 0, rank: int = 0, ranks: int = 1, batch: int = 1, stages: Sequence[tuple[int, Sequence[float]]] | None = None, blocklist: Sequence[tuple[int, int]] = ()):
        all_stages = [(0, [float(w) for w in weights])] + [(int(b), [float(w) for w in ws]) for b, ws in (stages or [])]
        blocklist = sorted({(int(d), int(r)) for d, r in blocklist})
        self.config = dict(lengths=[int(n) for n in lengths], seed=seed, rank=rank, ranks=ranks, batch=batch, stages=all_stages, blocklist=blocklist)
        self._native = _zrecord.Mixture([int(n) for n in lengths], all_stages, seed, rank, ranks, batch, blocklist)
        #: Global batches consumed.
        self.batches = 0
        #: The global batch the stream ends at (a token mixture's budgets all spent), if any.
        self.end: int | None = None

    def __getstate__(self) -> dict:
        # Its configuration and place: a worker process (Grain's, PyTorch's) rebuilds it.
        return {"config": self.config, "batches": self.batches, "end": self.end}

    def __setstate__(self, state: dict) -> None:
        c = state["config"]
        self.config = dict(c)
        stages = [(int(b), list(ws)) for b, ws in c["stages"]]
        blocklist = [(int(d), int(r)) for d, r in c.get("blocklist", [])]
        self._native = _zrecord.Mixture(list(c["lengths"]), stages, c["seed"], c["rank"], c["ranks"], c["batch"], blocklist)
        self.batches = state["batches"]
        self.end = state.get("end")

    def batch_at(self, batch: int) -> tuple[np.ndarray, np.ndarray]:
        """This rank's part of global batch ``batch``: (source, index)."""
        return self._native.batch(int(batch))

    def describe(self) -> dict:
        """The order's part of a run's description (``run.json``; see ``Loader.describe``)."""
        c = self.config
        return {
            "format": "zrecord-run",
            "version": 1,
            "order": {"mixture": {"lengths": c["lengths"], "stages": [{"start": b, "weights": ws} for b, ws in c["stages"]], "seed": c["seed"], "rank": 0, "ranks": c["ranks"], "batch": c["batch"]}},
            "datasets": [],
            "blocklist": [list(p) for p in c["blocklist"]],
        }

    def manifest(self, step: int) -> list[dict]:
        """Global batch ``step`` — what every rank reads, in rank order — computed, not
        logged: {"rank", "slot", "dataset", "record", "replaced", "epoch"} per position
        (``epoch``: the dataset's own)."""
        return _manifest(self.describe(), step)

    def skip(self, steps: int) -> None:
        """Counts the next ``steps`` global batches as read, unread."""
        self.batches += int(steps)

    def drawn_before(self, batch: int) -> list[int]:
        """Records of each dataset read before global batch ``batch`` (by every rank)."""
        return self._native.drawn_before(int(batch))

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        while self.end is None or self.batches < self.end:
            batch = self.batch_at(self.batches)
            self.batches += 1
            yield batch

    @classmethod
    def by_tokens(cls, sources: Sequence[tuple[float, Any]], seed: int = 0, rank: int = 0, ranks: int = 1, batch: int = 1) -> "Mixture":
        """A mixture weighed in tokens: ``sources`` is [(token weight, source), …], each
        source a ``TokenSource`` (a dataset, a stream's packed rows or windows, with its
        tokens per record and an optional budget) or a nested list of the same shape, its
        weights renormalized at its level as its sources run out. A source's record weight is
        its token weight over its tokens per record; a budget spent drops it at the next
        global batch, and when every source has one and all are spent, the stream ends at
        global batch ``end``. The datasets of a ``Loader`` over it are the leaves, in order
        (``leaves``)."""
        import json  # noqa: PLC0415

        leaves: list[TokenSource] = []

        def tree(node: Any) -> dict:
            if isinstance(node, TokenSource):
                leaves.append(node)
                leaf: dict[str, Any] = {"len": node.length, "tokens_per_record": node.tokens_per_record}
                if node.tokens is not None:
                    leaf["tokens"] = int(node.tokens)
                if node.epochs is not None:
                    leaf["epochs"] = float(node.epochs)
                return leaf
            if isinstance(node, (list, tuple)) and node and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in node):
                return {"group": [[float(w), tree(child)] for w, child in node]}
            raise TypeError(f"a mixture's source is a TokenSource or a list of (weight, source), not {type(node).__name__}")

        spec = tree(list(sources))
        stages, end, budgets = _zrecord.token_mixture(json.dumps(spec), int(seed), int(rank), int(ranks), int(batch))
        mixture = cls([leaf.length for leaf in leaves], stages[0][1], seed=seed, rank=rank, ranks=ranks, batch=batch, stages=stages[1:])
        mixture.end = end
        mixture.budgets = budgets
        mixture.leaves = [leaf.dataset for leaf in leaves]
        return mixture

    def state_dict(self) -> dict:
        import json  # noqa: PLC0415

        return json.loads(self._native.state_at(self.batches))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resumes from ``state`` (taken with any ranks of the same global batch); refused,
        naming what differs, if it is of another stream."""
        import json  # noqa: PLC0415

        self.batches = self._native.check_state(json.dumps(dict(state)))


class TokenSource:
    """A source of a token-weighted mixture (``Mixture.by_tokens``): ``dataset`` (a dataset,
    or a stream's packed rows or windows), its tokens per record (by default a packed row's
    real tokens on average, a window's width; give it for record datasets, e.g. the mean of
    ``token_lengths``), and a budget: ``tokens`` read at most, or ``epochs`` over it."""

    def __init__(self, dataset: Any, tokens_per_record: float | None = None, tokens: int | None = None, epochs: float | None = None):
        if tokens is not None and epochs is not None:
            raise ValueError("give a budget of tokens or of epochs, not both")
        if tokens_per_record is None:
            stats = getattr(dataset, "stats", None)
            if callable(stats):
                s = stats()
                tokens_per_record = s["tokens"] / max(1, s["rows"])
            elif hasattr(dataset, "width"):
                tokens_per_record = float(dataset.width)
            else:
                raise ValueError("give tokens_per_record for a record dataset (e.g. the mean of zrecord.token_lengths)")
        self.dataset = dataset
        self.length = len(dataset) if not isinstance(dataset, (int, np.integer)) else int(dataset)
        self.tokens_per_record = float(tokens_per_record)
        self.tokens = tokens
        self.epochs = epochs


class RampSampler:
    """Batches of indices for one rank whose global size changes during the run: a ramp as
    Megatron-LM's ``--rampup-batch-size START INCREMENT SAMPLES`` gives it up to ``global``
    (``ramp=(start, increment, samples)``), or explicit ``stages`` [(from_sample, size), …].
    Step k takes the next global batch of the run's order (``seed``'s shuffle of ``length``
    records, epoch after epoch); rank ``rank`` of ``ranks`` its ``rank``-th equal slice.

    ``state_dict()`` is what was consumed — steps, samples, and the size of every stretch of
    steps — the same on every rank; ``load_state_dict`` resumes under any ``ranks`` that
    divides the global batch in force then, accepts a schedule changed for steps not taken
    yet (saying so in ``changes_at``), and refuses one that rewrites a step already taken,
    naming it. Iterating yields steps without end."""

    def __init__(self, length: int, global_batch: int | None = None, ramp: tuple[int, int, int] | None = None, stages: Sequence[tuple[int, int]] | None = None, seed: int = 0, rank: int = 0, ranks: int = 1, mixture: "Mixture | None" = None):
        import json  # noqa: PLC0415

        if stages is not None:
            if ramp is not None:
                raise ValueError("give a ramp or stages, not both")
            schedule = {"Stages": [[int(a), int(b)] for a, b in stages]}
        elif ramp is not None:
            if global_batch is None:
                raise ValueError("a ramp needs the global_batch it ramps up to")
            start, increment, samples = (int(x) for x in ramp)
            schedule = {"Ramp": {"start": start, "increment": increment, "samples": samples, "global": int(global_batch)}}
        elif global_batch is not None:
            schedule = {"Stages": [[0, int(global_batch)]]}
        else:
            raise ValueError("give a global_batch, a ramp (with global_batch) or stages")
        self.config = dict(length=int(length), seed=int(seed), rank=int(rank), ranks=int(ranks), schedule=schedule)
        #: A mixture whose stream the steps read (its global batch 1), if any; a Loader over
        #: the ramp is then given its datasets.
        self.mixture = mixture
        if mixture is not None:
            if mixture.config["batch"] * mixture.config["ranks"] != 1:
                raise ValueError("a ramp reads a mixture made with batch=1 and ranks=1 (its stages then start at positions); the ramp splits each step among the ranks")
            self._native = _zrecord.RampSampler.over_mixture(mixture._native, int(rank), int(ranks), json.dumps(schedule))
        else:
            self._native = _zrecord.RampSampler(int(length), int(seed), int(rank), int(ranks), json.dumps(schedule))
        self._state = self._native.start()
        #: The first step the schedule changed at when the run was resumed (None: unchanged).
        self.changes_at: int | None = None

    def __getstate__(self) -> dict:
        return {"config": self.config, "state": self._state, "mixture": self.mixture}

    def __setstate__(self, state: dict) -> None:
        import json  # noqa: PLC0415

        c = state["config"]
        self.config = dict(c)
        self.mixture = state.get("mixture")
        if self.mixture is not None:
            self._native = _zrecord.RampSampler.over_mixture(self.mixture._native, c["rank"], c["ranks"], json.dumps(c["schedule"]))
        else:
            self._native = _zrecord.RampSampler(c["length"], c["seed"], c["rank"], c["ranks"], json.dumps(c["schedule"]))
        self._state = state["state"]
        self.changes_at = None

    @property
    def steps(self) -> int:
        import json  # noqa: PLC0415

        return json.loads(self._state)["steps"]

    @property
    def samples(self) -> int:
        import json  # noqa: PLC0415

        return json.loads(self._state)["samples"]

    def global_batch(self, samples: int | None = None) -> int:
        """The global batch of the step after ``samples`` consumed (default: the next)."""
        return self._native.global_batch(self.samples if samples is None else int(samples))

    def step_at(self, state: str) -> tuple[np.ndarray, str]:
        """This rank's indices of the step at ``state`` (as JSON), and the state after it."""
        return self._native.step(state)

    def __iter__(self) -> Iterator[np.ndarray]:
        while True:
            indices, self._state = self._native.step(self._state)
            yield indices

    def state_dict(self) -> dict:
        import json  # noqa: PLC0415

        return json.loads(self._state)

    def describe(self) -> dict:
        """The order's part of a run's description (``run.json``; see ``Loader.describe``)."""
        c = self.config
        ramp: dict[str, Any] = {"schedule": c["schedule"], "ranks": c["ranks"], "len": c["length"], "seed": c["seed"]}
        if self.mixture is not None:
            ramp["mixture"] = self.mixture.describe()["order"]["mixture"]
        return {"format": "zrecord-run", "version": 1, "order": {"ramp": ramp}, "datasets": [], "blocklist": []}

    def manifest(self, step: int) -> list[dict]:
        """Global batch ``step`` — what every rank reads, in rank order — computed from the
        schedule, not logged: {"rank", "slot", "dataset", "record", "replaced", "epoch"}."""
        return _manifest(self.describe(), step)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        import json  # noqa: PLC0415

        self._state, self.changes_at = self._native.resume(json.dumps(dict(state)))
        if self.changes_at is not None:
            import warnings  # noqa: PLC0415

            warnings.warn(f"the batch-size schedule changes from step {self.changes_at} on, which no step taken so far saw", stacklevel=2)


class TokenBudget:
    """Variable-length examples (``lengths`` tokens each) in micro-batches of at most
    ``max_tokens`` tokens — ``cost="padded"``: count × longest, or ``"packed"``: their sum —
    every rank of ``ranks`` getting ``accumulation`` micro-batches in every step, with no
    communication. Each epoch takes the examples in its own shuffled order, ``lookahead`` at
    a time sorted by length. ``remainder`` says what an epoch's micro-batches left over by
    its last whole step become: ``"carry"`` (the next epoch completes the step), ``"pad"``
    (empty micro-batches, given as None) or ``"drop"``; ``too_long`` says what an example
    longer than the budget becomes: ``"refuse"`` (a ValueError naming it) or ``"skip"``.

    Iterating yields this rank's steps without end: each a list of ``accumulation``
    micro-batches, each an array of example indices (or None). ``state_dict()`` is the same
    on every rank and resumes under any ``ranks`` and ``accumulation``; ``gather`` reads a
    micro-batch of token arrays from a dataset, padded or packed."""

    _PLAN_KEYS = ("seed", "len", "max_tokens", "cost", "lookahead", "remainder", "too_long")

    def __init__(self, lengths: Any, max_tokens: int, rank: int = 0, ranks: int = 1, accumulation: int = 1, cost: str = "padded", lookahead: int = 1024, remainder: str = "carry", too_long: str = "refuse", seed: int = 0):
        lengths = np.ascontiguousarray(np.asarray(lengths).reshape(-1), dtype=np.uint64)
        if not 0 <= int(rank) < int(ranks):
            raise ValueError(f"rank {rank} is not one of the {ranks} ranks")
        self.config = dict(len=int(lengths.size), max_tokens=int(max_tokens), rank=int(rank), ranks=int(ranks), accumulation=int(accumulation), cost=cost, lookahead=int(lookahead), remainder=remainder, too_long=too_long, seed=int(seed))
        self._native = _zrecord.TokenBudget(lengths, int(max_tokens), cost, int(lookahead), int(ranks), int(accumulation), remainder, too_long, int(seed))
        self._lengths = lengths
        #: Where the next step starts: the next micro-batch is ``micro`` of ``epoch``.
        self.epoch = 0
        self.micro = 0

    @property
    def skipped(self) -> int:
        """Examples left out for being longer than the budget (``too_long="skip"``)."""
        return self._native.skipped()

    def step_at(self, epoch: int, micro: int) -> tuple[list, int, int]:
        """This rank's micro-batches of the step starting at (``epoch``, ``micro``), and
        where the next starts."""
        return self._native.step(int(epoch), int(micro), self.config["rank"])

    def __iter__(self) -> Iterator[list]:
        while True:
            step, epoch, micro = self.step_at(self.epoch, self.micro)
            if not step:
                return  # no example fits the budget
            self.epoch, self.micro = epoch, micro
            yield step

    def state_dict(self) -> dict:
        c = self.config
        return {key: c[key] for key in self._PLAN_KEYS} | {"epoch": self.epoch, "micro": self.micro}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resumes where ``state`` says (taken under any ranks and accumulation); refused,
        naming what differs, if it is of another schedule."""
        missing = [k for k in (*self._PLAN_KEYS, "epoch", "micro") if k not in state]
        if missing:
            raise ValueError(f"not a token budget's state: it lacks {', '.join(missing)}")
        for key in self._PLAN_KEYS:
            if state[key] != self.config[key]:
                raise ValueError(f"the checkpoint's {key} is {state[key]!r} and this schedule's is {self.config[key]!r}: it is of another schedule")
        self.epoch, self.micro = int(state["epoch"]), int(state["micro"])

    def gather(self, dataset: Dataset, micro: Any, field: str, dtype: Any = np.uint32, mask_field: str | None = None) -> dict | None:
        """Micro-batch ``micro`` (example indices) of ``field`` (token arrays of ``dtype``):
        padded (``cost="padded"``): {"tokens": (B, longest), "lengths": (B,), ["loss_mask":
        (B, longest)]}; packed: {"tokens": (1, total), "positions", "segment_ids",
        ["loss_mask"], "cu_seqlens", "max_seqlen"}. None for a padding micro-batch."""
        if micro is None:
            return None
        dtype = np.dtype(dtype)
        names = [field] if mask_field is None else [field, mask_field]
        got = dataset.gather(micro, names)
        values, offsets = got[field]
        tokens = values.view(dtype)
        lengths = np.diff(offsets) // dtype.itemsize
        starts = offsets[:-1] // dtype.itemsize
        mask = None
        if mask_field is not None:
            mvalues, moffsets = got[mask_field]
            mask = mvalues.astype(np.bool_)
            if not np.array_equal(np.diff(moffsets), lengths):
                raise ValueError(f"field '{mask_field}' holds a mask of another length than '{field}''s tokens")
        if self.config["cost"] == "padded":
            longest = int(lengths.max(initial=0))
            out = np.zeros((lengths.size, longest), dtype=dtype)
            keep = np.zeros((lengths.size, longest), dtype=np.bool_) if mask is not None else None
            for k, (start, n) in enumerate(zip(starts, lengths)):
                out[k, :n] = tokens[start : start + n]
                if keep is not None:
                    keep[k, :n] = mask[start : start + n]
            batch = {"tokens": out, "lengths": lengths.astype(np.int64)}
            if keep is not None:
                batch["loss_mask"] = keep
            return batch
        cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        positions = np.arange(int(cu[-1]), dtype=np.int32) - np.repeat(cu[:-1], lengths)
        segments = np.repeat(np.arange(1, lengths.size + 1, dtype=np.int32), lengths)
        batch = {"tokens": tokens.reshape(1, -1), "positions": positions.reshape(1, -1), "segment_ids": segments.reshape(1, -1), "cu_seqlens": cu, "max_seqlen": int(lengths.max(initial=0))}
        if mask is not None:
            batch["loss_mask"] = mask.reshape(1, -1)
        return batch


def token_lengths(dataset: Dataset, field: str, dtype: Any = np.uint32, chunk: int = 1 << 16) -> np.ndarray:
    """Tokens in each record's ``field`` (token arrays of ``dtype``): what ``TokenBudget``
    takes. Reads the field once, ``chunk`` records at a time."""
    itemsize = np.dtype(dtype).itemsize
    n = len(dataset)
    out = np.empty(n, dtype=np.uint64)
    for start in range(0, n, chunk):
        _, offsets = dataset.gather(np.arange(start, min(start + chunk, n), dtype=np.uint64), [field])[field]
        out[start : start + offsets.size - 1] = np.diff(offsets) // itemsize
    return out


def _manifest(description: Mapping[str, Any], step: int) -> list[dict]:
    import json  # noqa: PLC0415

    rows = _zrecord.explain(json.dumps(description), int(step))
    names = [d.get("name", str(k)) for k, d in enumerate(description.get("datasets", []))]
    return [
        {"rank": rank, "slot": slot, "dataset": names[d] if d < len(names) else d, "record": record, "replaced": replaced, "epoch": epoch}
        for rank, slot, d, record, replaced, epoch in rows
    ]


def _mixture_fields(datasets: list[Dataset], mixture: Mixture, fields: Sequence[str] | None) -> list[Field]:
    """The fields a loader over ``mixture`` reads from ``datasets``, checked: one dataset per
    source, each as long as the mixture has it, each holding every field alike."""
    lengths = mixture.config["lengths"]
    if len(datasets) != len(lengths):
        raise ValueError(f"the mixture has {len(lengths)} datasets and the loader was given {len(datasets)}")
    for i, (ds, n) in enumerate(zip(datasets, lengths)):
        if len(ds) != n:
            raise ValueError(f"dataset {i} holds {len(ds)} records and the mixture has it at {n}")
    names = _names_of(fields) if fields is not None else [f.name for f in datasets[0].fields]
    chosen = []
    for name in names:
        first = None
        for i, ds in enumerate(datasets):
            if all(f.name != name for f in ds.fields):
                raise KeyError(f"dataset {i} has no field '{name}' (it has: {', '.join(f.name for f in ds.fields)})")
            f = ds._field(name)
            if first is None:
                first = f
            elif (f.dtype, f.shape) != (first.dtype, first.shape):
                raise ValueError(f"field '{name}' is {f.dtype}{list(f.shape or [])} in dataset {i} and {first.dtype}{list(first.shape or [])} in dataset 0: a batch needs one kind")
        chosen.append(first)
    return chosen
