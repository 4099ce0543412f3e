"""Whether fake CUDA tensors can predict honestly on this torch (a probe of known answer)."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from cl_audit.fake.mode import fake_tensor, new_fake_mode

__all__ = ["fake_cuda_problem"]


@functools.cache
def fake_cuda_problem(bfloat16: bool = False, runtime: bool = True) -> str | None:
    """Why fake CUDA tensors cannot give an honest prediction with this torch, or None.

    A probe of known answer: a float32 convolution of channels_last data must come back
    channels_last (a CPU-only build has no cuDNN to choose that, and predicts NCHW), and an
    indexing step, a float16 softmax and a bfloat16 convolution must run without reaching the
    CUDA runtime (torch 2.9 and earlier do, and fail on a machine without a GPU; not probed
    with ``runtime`` False, for a caller that makes each call reaching it an error of its own).
    With ``bfloat16`` the bfloat16 convolution must come back channels_last too: without a
    GPU, torch 2.10 and later pick the slow NCHW convolution for bfloat16 (cuDNN's bfloat16
    check needs a device), where a GPU with bfloat16 cuDNN keeps channels_last.
    """
    mode = new_fake_mode()
    device = torch.device("cuda")
    cl = torch.channels_last
    step = "making fake CUDA tensors"
    try:
        x = fake_tensor(mode, torch.empty(2, 16, 6, 6, device="meta").to(memory_format=cl), device)
        w = fake_tensor(mode, torch.empty(16, 16, 3, 3, device="meta").to(memory_format=cl), device)
        with mode:
            step = "a float32 convolution"
            y = z = F.conv2d(x, w, padding=1)
            if runtime:
                step = "an indexing step (x[:, :4])"
                F.relu(x[:, :4])
                step = "a float16 softmax"
                F.softmax(x.half(), dim=1)
                step = "a bfloat16 convolution"
                z = F.conv2d(x.bfloat16(), w.bfloat16(), padding=1)
    except Exception as e:  # the probe's answer: the reason is given to the user
        cause = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return f"on torch {torch.__version__}, {step} on fake CUDA tensors fails ({cause})"
    build = " (a CPU-only build)" if torch.version.cuda is None else ""
    if not y.is_contiguous(memory_format=cl):
        return (
            f"torch {torch.__version__}{build} gives a channels_last CUDA convolution an NCHW "
            "output in fake mode, where CUDA keeps channels_last: its predictions would be wrong"
        )
    if bfloat16 and not z.is_contiguous(memory_format=cl):
        return (
            f"without a GPU, torch {torch.__version__} predicts an NCHW bfloat16 CUDA "
            "convolution (cuDNN's bfloat16 support is checked on a device), where a GPU with "
            "bfloat16 cuDNN keeps channels_last; predict with float16, or run on a GPU"
        )
    return None
