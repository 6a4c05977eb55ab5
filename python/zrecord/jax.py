"""JAX helper, duck-typed (JAX is imported only when called)."""

from __future__ import annotations

from typing import Any

import numpy as np


def global_batch(local: dict, sharding: Any) -> dict:
    """One global array per field of ``local`` (this process's slice of the batch, as a
    ``Loader`` yields it, from a ``Sampler`` with ``rank = jax.process_index()`` and ``ranks
    = jax.process_count()``), laid out by ``sharding``, with
    ``jax.make_array_from_process_local_data``. Variable-size fields are skipped."""
    import jax  # noqa: PLC0415 - optional dependency

    out = {}
    for name, value in local.items():
        if isinstance(value, np.ndarray):
            out[name] = jax.make_array_from_process_local_data(sharding, value)
    return out
