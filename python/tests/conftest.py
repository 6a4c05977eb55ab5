"""What the tests share."""

import pathlib
import shutil

import pytest


@pytest.fixture
def zr_binary():
    """The ``zr`` program: on the PATH, or built in the workspace's target directory; None
    where it is neither (the tests that need it skip)."""
    here = pathlib.Path(__file__).resolve().parents[2] / "target"
    for candidate in (shutil.which("zr"), here / "debug" / "zr", here / "release" / "zr"):
        if candidate and pathlib.Path(candidate).exists():
            return str(candidate)
    return None
