"""Every Python code block of the documentation runs (issue #67): a block of test functions under
pytest with the plugin, a script as a script, and the API block with the names it says it is
given (``model``, ``x``, ``example_input``, a UNet-like ``unet`` with its ``x``, ``t``, ``h``),
each in a subprocess in a folder of its own, as a user would paste it."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)

# What the API block says it is given, made small (a sweep in it runs its models as written).
GIVEN = textwrap.dedent(
    """
    import torch
    from torch import nn


    class _UNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.proj = nn.Linear(8, 4)

        def forward(self, sample, timestep, encoder_hidden_states):
            bias = self.proj(encoder_hidden_states).mean(1)[:, :, None, None]
            return self.conv(sample) + bias + timestep.float().mean()


    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 1))
    example_input = torch.randn(2, 3, 16, 16)
    model = model.to(memory_format=torch.channels_last)
    x = example_input.to(memory_format=torch.channels_last)
    unet, t, h = _UNet(), torch.tensor([10]), torch.randn(2, 8, 8)
    """
)


def _blocks() -> list[tuple[str, str]]:
    found = []
    for path in DOCUMENTS:
        for n, match in enumerate(BLOCK.finditer(path.read_text()), 1):
            found.append((f"{path.relative_to(ROOT)}#{n}", match.group(1)))
    return found


BLOCKS = _blocks()


def test_the_documents_hold_python_blocks_to_run():
    assert len(BLOCKS) >= 5  # docs/usage.md's two, docs/integrations.md's three


@pytest.mark.slow
@pytest.mark.parametrize(("where", "code"), BLOCKS, ids=[w for w, _ in BLOCKS])
def test_every_python_block_of_the_docs_runs(where, code, tmp_path):
    if re.search(r"^def test_", code, re.MULTILINE):
        (tmp_path / "test_block.py").write_text(code)
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "."]
    else:
        given = GIVEN if "given: model" in code else ""
        (tmp_path / "block.py").write_text(given + code)
        command = [sys.executable, "block.py"]
    env = {"YOLO_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        command, cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**__import__("os").environ, **env},
    )  # fmt: skip
    assert result.returncode == 0, f"{where}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
