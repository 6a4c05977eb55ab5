"""An in-process zrecord cluster (nodes and a router on 127.0.0.1, mutual TLS from a
generated CA), for tests and examples: ``with LocalCluster(2, [("x", "raw")]) as c:
ds = zrecord.connect(c.router, c.certs)``."""

from __future__ import annotations

from typing import Sequence

from . import _zrecord


BUILT_WITH_TESTING = hasattr(_zrecord, "LocalCluster")


class LocalCluster:
    def __init__(self, shards: int, fields: Sequence[tuple[str, str]], replicas: int = 1):
        if not BUILT_WITH_TESTING:
            raise RuntimeError(
                "this build of zrecord has no in-process cluster (the simulator is left out of "
                "wheels): build it with MATURIN_PEP517_ARGS=\"--features extension-module,testing\" "
                "pip install ./python"
            )
        self._cluster = _zrecord.LocalCluster(shards, list(fields), replicas)
        self.router = self._cluster.router()
        self.certs = self._cluster.certs()

    def stop(self) -> None:
        self._cluster.stop()

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
