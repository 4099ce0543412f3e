"""Pin channels_last in a test suite with cl-audit's pytest plugin (installed with cl-audit)."""

import pytest
import torch
import torchvision
from torch import nn


class Classifier(nn.Module):
    """A convolution, then a flatten: the flatten copies the channels_last map (a known loss)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8 * 16 * 16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.conv(x).relu(), 1))


def test_resnet_keeps_channels_last(cl_audit):
    # converted to channels_last, audited against NCHW; a cost that reaches the gate fails the
    # test with its table
    cl_audit.check(torchvision.models.resnet18(), torch.randn(2, 3, 64, 64))


def test_known_flatten_is_allowed(cl_audit):
    # today's known offence, pinned by op and call site (a 16 KiB copy, under the gate anyway;
    # --cl-audit-strict fails on any cost): anything new that reaches the gate still fails
    cl_audit.check(Classifier(), torch.randn(2, 3, 16, 16), allow=[("torch.flatten", "*")])


def test_block_in_the_format_the_test_gives(cl_audit):
    conv = nn.Conv2d(3, 8, 3).to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 16, 16).to(memory_format=torch.channels_last)
    with cl_audit.block("conv then relu"):
        conv(x).relu()


# After the test passes, each model it ran is audited: here a training step in channels_last,
# against the same step in NCHW. On the CPU the convolution backward copies its weight gradient
# in channels_last (a kernel matter): pinned by its op; any other cost that reaches the gate
# (1% of the bytes written and 1 MiB, at batch 32) would fail.
@pytest.mark.cl_audit(train=True, allow=["aten.convolution_backward"])
def test_every_model_this_test_runs_is_audited_in_training():
    model = torchvision.models.mobilenet_v3_small(num_classes=10)
    assert model(torch.randn(2, 3, 64, 64)).shape == (2, 10)
