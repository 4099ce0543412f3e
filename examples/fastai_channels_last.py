"""Audit the first training batch of a fastai Learner that trains in channels_last with mixed
precision, the configuration fastai's documentation recommends (pip install 'cl-audit[fastai]')."""

import torch
from fastai.callback.channelslast import ChannelsLast
from fastai.callback.fp16 import MixedPrecision
from fastai.data.core import DataLoaders
from fastai.learner import Learner
from torch import nn

from cl_audit.integrations.fastai import ChannelsLastAudit


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.head = nn.Linear(16 * 16 * 16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.conv(x).relu(), 1))  # flatten: a copy, a loss


images, labels = torch.randn(16, 3, 16, 16), torch.randint(0, 2, (16,))
data = list(zip(images, labels, strict=True))
dls = DataLoaders.from_dsets(data, data, bs=8, device="cpu")
cbs = [ChannelsLast(), MixedPrecision(), ChannelsLastAudit(json_path="cl_audit_fastai.json")]
learn = Learner(dls, Net(), loss_func=nn.CrossEntropyLoss(), cbs=cbs)
learn.fit(1)

report = learn.cl_audit_report  # also printed, and written to cl_audit_fastai.json
print([(f.op, f.phase.value) for f in report.offenders])
