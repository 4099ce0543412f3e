"""What the running torch does, checked directly: tests whose expectation depends on torch's
kernels derive it from here, never from one release's behaviour written into the test."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cl_audit.fake.backward import backward_problem
from cl_audit.fake.cuda_probe import fake_cuda_problem
from cl_audit.fake.mode import fake_tensor, new_fake_mode

FAKE_CUDA_PROBLEM = fake_cuda_problem()
needs_fake_cuda = pytest.mark.skipif(
    FAKE_CUDA_PROBLEM is not None, reason=f"fake CUDA is refused here: {FAKE_CUDA_PROBLEM}"
)


BACKWARD_PROBLEM = backward_problem()
needs_node_by_node = pytest.mark.skipif(
    BACKWARD_PROBLEM is not None, reason=f"--train --fake is refused here: {BACKWARD_PROBLEM}"
)


def _channels_last(t: torch.Tensor) -> bool:
    return t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()


def fake_group_norm_loses_what_eager_keeps() -> bool:
    """Fake ``native_group_norm`` returns NCHW for channels_last input where eager CPU keeps
    channels_last (torch 2.14 alone, as measured)."""
    x = torch.randn(2, 8, 4, 4).contiguous(memory_format=torch.channels_last)
    eager = F.group_norm(x, 2)
    with new_fake_mode() as mode:
        fake = F.group_norm(mode.from_tensor(x), 2)
    return _channels_last(eager) and not _channels_last(fake)


def fake_cuda_group_norm_returns_nchw() -> bool:
    """Fake ``native_group_norm`` on CUDA, without cl-audit's kernel-source overrides."""
    x = torch.empty(2, 8, 4, 4, device="meta").contiguous(memory_format=torch.channels_last)
    mode = new_fake_mode()
    with mode:
        out = F.group_norm(fake_tensor(mode, x, torch.device("cuda")), 2)
    return not _channels_last(out)


def dropout_draws_in_memory_order() -> bool:
    """Whether a dropout of a channels_last map draws a different mask from the same map in
    NCHW under the same seed (its random numbers laid out in memory order)."""
    x = torch.ones(2, 8, 6, 6)
    masks = []
    for t in (x, x.contiguous(memory_format=torch.channels_last)):
        torch.manual_seed(0)
        masks.append(F.dropout(t, 0.5, True))
    return not torch.equal(*masks)
