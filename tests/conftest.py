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
# Each test process its own Inductor cache (its subprocesses share it): two processes building
# one kernel into one cache can read a half-written .so ("file too short": seen with the
# compiled proof's two lanes on one cache).
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="cl-audit-inductor-"))


def channels_last(*shape: int) -> torch.Tensor:
    fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
    return torch.randn(*shape).contiguous(memory_format=fmt)


@pytest.fixture(params=["dispatch", "patch"])
def engine(request: pytest.FixtureRequest) -> str:
    return request.param


# The unit tier (``pytest -m unit``, under a minute on 2 cores): the modules whose tests start
# no subprocess and build no registry model: the rule, the recorder and ledger, the speed model
# and its tables, the codec and the envelopes, the renderers, the restoring of torch.
UNIT_MODULES = frozenset(
    ["test_attribution", "test_codec", "test_compare", "test_docs", "test_layout",
     "test_one_time", "test_ops_raised", "test_provenance", "test_recorder", "test_render",
     "test_report", "test_restore", "test_rule", "test_signature", "test_speed_tables",
     "test_timing", "test_session", "test_registry", "test_groups", "test_stages"]
)  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.stem in UNIT_MODULES:
            item.add_marker(pytest.mark.unit)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        help="Rewrite the golden files of the rendering tests from the current output.",
    )
