"""Audit the first training batch of a Lightning fit, bf16 autocast included
(pip install 'cl-audit[lightning]'); the report lands in the trainer's log directory."""

import lightning.pytorch as pl
import torch
from torch import nn

from cl_audit.integrations.lightning import ChannelsLastAudit


class Net(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.head = nn.Linear(16 * 16 * 16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.conv(x).relu(), 1))  # flatten: a copy, a loss

    def training_step(self, batch, batch_idx):
        images, labels = batch
        return nn.functional.cross_entropy(self(images), labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


images, labels = torch.randn(16, 3, 16, 16), torch.randint(0, 2, (16,))
loader = torch.utils.data.DataLoader(list(zip(images, labels, strict=True)), batch_size=8)
audit = ChannelsLastAudit(to_channels_last=True)  # converts the module before DDP wraps it
trainer = pl.Trainer(max_epochs=1, precision="bf16-mixed", accelerator="cpu", callbacks=[audit])
trainer.fit(Net(), loader)

print(audit.path)  # <log dir>/cl_audit.json; the counts went to the loggers as cl_audit/...
print([(f.op, f.phase.value) for f in audit.report.offenders])
