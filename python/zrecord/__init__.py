"""zrecord: random batch reads of byte records at memory speed.

Local datasets (``zrecord.open``, ``zrecord.create``) and clusters (``zrecord.connect``) share
one API: ``len(ds)``, ``ds.fields``, ``ds[i]``, ``ds.gather(indices, fields=None, out=None)``,
and writes (``append``, ``append_many``, ``modify``, ``delete``, ``commit``). A field with a
dtype and shape gathers into a NumPy array of shape ``(B, *shape)``; any other field into
``(values: uint8[...], offsets: int64[B + 1])``. Gathers release the GIL and copy each record
once, straight into its destination.

Token streams (``zrecord.create_stream``, ``zrecord.open_stream``; see ``zrecord.stream``)
hold LLM pre-training tokens with their document boundaries; ``stream.windows(seq_len)`` is
a dataset of windows computed at read time.

Samplers (``zrecord.Sampler``) and a prefetching loader (``zrecord.Loader``) resume exactly
from ``state_dict()``. ``zrecord.torch``, ``zrecord.grain`` and ``zrecord.jax`` adapt them to
those frameworks without depending on them.

Datasets and clients are fork-safe: they pickle as their path (or router and certificates)
and reopen themselves in a child process, so a forking ``DataLoader`` works.

A local dataset has one writer at a time and any number of readers beside it, in any
processes. A reader sees the dataset as of a commit, never a record in part: the last one
when it opened, and the last one again at ``len()``, ``refresh()`` or a gather of an index
past the length it has (so records committed since appear when asked for); records modified
or deleted meanwhile change under no gather. ``close()`` (or ``with``) lets
a dataset go; leaving a ``with`` block of a writable dataset without an error commits it.
"""

from __future__ import annotations

from ._zrecord import CorruptRecord, Error

__all__ = [
    "CorruptRecord",
    "Dataset",
    "Error",
    "Field",
    "Loader",
    "Mixture",
    "RampSampler",
    "Sampler",
    "connect",
    "create",
    "arrow_fields",
    "from_arrays",
    "from_arrow",
    "from_numpy",
    "open",
    "Stream",
    "TokenBudget",
    "TokenSource",
    "token_lengths",
    "tokenize_jsonl",
    "Windows",
    "Packed",
    "create_stream",
    "open_stream",
    "train_dict",
    "train_dictionary",
]


from .dataset import (  # noqa: E402
    Dataset,
    Field,
    connect,
    create,
    from_arrays,
    from_numpy,
    open,
    train_dict,
    train_dictionary,
)
from .sampling import Mixture, RampSampler, Sampler, TokenBudget, TokenSource, token_lengths  # noqa: E402
from .loader import Loader  # noqa: E402
from .stream import Packed, Stream, Windows, create_stream, open_stream, tokenize_jsonl  # noqa: E402
from .arrow import arrow_fields, from_arrow  # noqa: E402
