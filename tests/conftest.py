from __future__ import annotations

import os
import sys
import tempfile

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

torch.set_num_threads(1)
# The speed tables a test sees are the shipped ones and what it makes itself: never the user's
# own (``cl-audit table`` writes them to the user's cache folder otherwise).
os.environ["CL_AUDIT_TABLES"] = tempfile.mkdtemp(prefix="cl-audit-tables-")


def channels_last(*shape: int) -> torch.Tensor:
    fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
    return torch.randn(*shape).contiguous(memory_format=fmt)


@pytest.fixture(params=["dispatch", "patch"])
def engine(request: pytest.FixtureRequest) -> str:
    return request.param


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        help="Rewrite the golden files of the rendering tests from the current output.",
    )
