"""Tiny modules for training audits, with the expected answers beside them.

Also usable as ``tests/training_models.py:<factory>`` from the CLI.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ActivationBeforePool(nn.Module):
    """mobilenet_v2's head: the global pool's backward (an expand and a division) makes an NCHW
    gradient; the activation's backward, given it and its own channels_last input, returns
    NCHW, and the convolution's backward converts it back. The forward keeps channels_last."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.act = nn.Hardtanh()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.act(self.conv(x))), 1))


class ResidualScaled(nn.Module):
    """A convolution's output used twice (its gradients add up) and scaled by a (C, 1, 1)
    parameter (its gradient summed to that shape): the autograd engine's own operations."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.act = nn.Hardtanh()
        self.scale = nn.Parameter(torch.ones(8, 1, 1))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        y = y + self.act(y) * self.scale
        return self.fc(torch.flatten(self.pool(y), 1))


class NonDenseWeight(nn.Module):
    """A parameter made from a strided view: autograd cannot give its gradient the same strides
    (the layout contract holds for dense parameters only), as DDP then reports."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)
        self.weight = nn.Parameter(torch.randn(8, 6, 3, 3)[:, ::2])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(self.conv(x), self.weight)


class _ContiguousGradient(torch.autograd.Function):
    """Identity forward; the backward hands on an NCHW copy of its gradient."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


class BackwardOnlyLoss(nn.Module):
    """A custom autograd Function whose backward makes its channels_last gradient NCHW: the
    forward keeps channels_last, the backward loses it (attributed to the module whose forward
    made the Function's node, ``head``) and the first convolution's backward converts back."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Conv2d(8, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(_ContiguousGradient.apply(self.conv(x))).sum(dim=(2, 3))


class KeepsFormat(nn.Module):
    """Two convolutions and a ReLU, pooled by a flatten of 1x1 maps: channels_last throughout,
    forward and backward (the control of the training audits)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(torch.relu(self.conv1(x))).sum(dim=(2, 3))


class HookedActivation(nn.Module):
    """A hook on an activation makes its gradient contiguous (the model's own backward-only
    loss, in a hook: ``hooked``), where without the hook the step keeps channels_last (the
    control)."""

    def __init__(self, hooked: bool = True) -> None:
        super().__init__()
        self.hooked = hooked
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv1(x))
        if self.hooked and y.requires_grad:
            y.register_hook(lambda grad: grad.contiguous())
        return self.conv2(y).sum(dim=(2, 3))


class NormAfterLostFormat(nn.Module):
    """A batch norm given NCHW input (the forward makes it contiguous) between two
    channels_last convolutions: on CUDA cuDNN's backward lays the input gradient out as its
    NCHW input, converting the channels_last gradient that the second convolution's backward
    returns (torch's fake decomposition followed that gradient). ``lost=False`` is the control:
    channels_last input, nothing converted. ``affine=False`` takes CUDA's native kernel, which
    lays the gradient out as the input too; ``frozen`` puts the norm in eval mode, whose CUDA
    backward is contiguous whatever it is given."""

    def __init__(self, lost: bool = True, affine: bool = True, frozen: bool = False) -> None:
        super().__init__()
        self.lost = lost
        self.frozen = frozen
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8, affine=affine)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)

    def train(self, mode: bool = True) -> NormAfterLostFormat:
        super().train(mode)
        self.bn.train(mode and not self.frozen)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv1(x)
        y = y.contiguous() if self.lost else y
        return self.conv2(self.bn(y)).sum(dim=(2, 3))


class NormBeforeLostFormat(nn.Module):
    """A batch norm given channels_last input whose output the forward makes contiguous: its
    backward receives an NCHW gradient. CUDA's kernels (cuDNN's, and the native one bfloat16
    takes) lay the input gradient out as the channels_last input, a regain at the norm
    (measured on an H200 with bfloat16 autocast); torch's fake decomposition followed the
    gradient, a loss there. ``affine=False`` takes CUDA's native kernel in float32."""

    def __init__(self, affine: bool = True) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8, affine=affine)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv1(x)).contiguous().square().sum(dim=(2, 3))


class MapAttention(nn.Module):
    """Attention over a channels_last map's positions, as CoAtNet's blocks make it (timm's
    ``maxxvit.Attention2d``): a 1x1 convolution gives q, k and v, the attention's output is
    transposed back and reshaped to the map. Where the memory-efficient kernel runs (a GPU takes
    it for a mask that learns), the output is sequence-major and the reshape a view that is
    channels_last; where cuDNN's or the math path runs (a fixed mask under float16), the output
    is contiguous and the reshape copies it, whose backward copies the channels_last gradient
    NCHW. ``dense=False`` hands the attention transposed views (not dense in their last
    dimension), which no fused kernel takes: the math path runs."""

    def __init__(self, learned: bool = True, dense: bool = True) -> None:
        super().__init__()
        self.dense = dense
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.qkv = nn.Conv2d(16, 48, 1)
        bias = torch.zeros(2, 256, 256)  # heads, positions, positions (16x16 maps)
        self.bias = nn.Parameter(bias) if learned else None
        self.register_buffer("fixed", None if learned else bias)
        self.proj = nn.Conv2d(16, 16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        b, _, h, w = x.shape
        q, k, v = self.qkv(x).view(b, 2, 24, -1).chunk(3, dim=2)
        mask = self.bias if self.bias is not None else self.fixed
        q, k, v = (t.transpose(-1, -2) for t in (q, k, v))
        if self.dense:
            q, k, v = (t.contiguous() for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(out.transpose(-1, -2).reshape(b, -1, h, w)).sum(dim=(2, 3))


class ActivationAfterLostFormat(nn.Module):
    """A hard-swish given NCHW input (the forward makes it contiguous) before a channels_last
    convolution: its backward kernel iterates over the incoming gradient first, so the
    convolution's channels_last gradient stays channels_last (torch 2.14's fake decomposition
    followed the NCHW input instead: a loss no kernel makes)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.act = nn.Hardswish()
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.act(self.conv1(x).contiguous())).sum(dim=(2, 3))


class BranchesOnValue(KeepsFormat):
    """KeepsFormat that branches on a value of its activations: fake tensors have no values,
    so a fake step fails there, named."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv1(x))
        if y.mean() > 0:  # data-dependent control flow
            y = y * 2
        return self.conv2(y).sum(dim=(2, 3))


class RecurrentHead(nn.Module):
    """A convolution whose map is read row by row by an LSTM: on fake CUDA tensors without a
    GPU, the LSTM's CUDA path asks the CUDA runtime (cuDNN) before computing."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.rnn = nn.LSTM(8, 8, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        rows = y.permute(0, 2, 3, 1).flatten(1, 2)
        return self.rnn(rows)[0].sum(dim=1)


def branches_on_value() -> tuple[nn.Module, tuple[int, ...]]:
    return BranchesOnValue(), (3, 16, 16)


def recurrent_head() -> tuple[nn.Module, tuple[int, ...]]:
    return RecurrentHead(), (3, 8, 8)


def keeps_format() -> tuple[nn.Module, tuple[int, ...]]:
    return KeepsFormat(), (3, 16, 16)


def activation_before_pool() -> tuple[nn.Module, tuple[int, ...]]:
    return ActivationBeforePool(), (3, 16, 16)


def map_loss(output: torch.Tensor) -> torch.Tensor:
    """A user's loss that copies the channels_last map to NCHW first: a loss of its own."""
    return output.contiguous().square().mean()


def own_loss() -> tuple[nn.Module, tuple[int, ...], object]:
    """A factory with its own training loss: (module, input_shape, loss)."""
    return nn.Conv2d(3, 8, 3, padding=1), (3, 16, 16), map_loss


class ViewedLogits(nn.Module):
    """Each channel's map viewed as a row, as torchvision's keypoint loss views its logits
    (``roi_heads.py``): the view merges the batch and channel dimensions, which channels_last
    strides cannot give, so only the NCHW step runs."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return y.view(-1, y.shape[2] * y.shape[3])


class ReshapedLogits(ViewedLogits):
    """The control: ``reshape`` copies where the view cannot, a loss that is still flagged."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return y.reshape(-1, y.shape[2] * y.shape[3])


class MisViewed(ViewedLogits):
    """A view of the wrong size: it fails in NCHW too, so channels_last is not the cause."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).view(-1, 7)


class ResizedPositions(nn.Module):
    """Tokens from a patch convolution plus a learned position table kept as a (1, H, W, C)
    grid and resized to the tokens' grid, as timm's naflexvit does
    (``_apply_learned_pos_embed``): permuted to (1, C, H, W), interpolated, flattened to tokens.
    A model made channels_last converts the 4-D table too, and the table's gradient comes back
    through the flatten's view as a (1, C, h, w) map whose batch stride every kernel's view
    makes NCHW: the interpolation's backward writes it NCHW in both runs, and AccumulateGrad
    copies it into the table's layout in both (no loss). ``resized=False`` adds the table as it
    is (the grid already the tokens'): its reshape copies the channels_last table forward and
    AccumulateGrad copies the contiguous gradient back into it, in channels_last only."""

    def __init__(self, resized: bool = True) -> None:
        super().__init__()
        self.resized = resized
        self.patch = nn.Conv2d(3, 24, 2, stride=2)  # 16x16 -> 8x8 tokens
        grid = 32 if resized else 8
        self.table = nn.Parameter(torch.zeros(1, grid, grid, 24))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patch(x).flatten(2).transpose(1, 2)
        if self.resized:
            grid = F.interpolate(self.table.permute(0, 3, 1, 2), size=(8, 8), mode="bilinear")
            table = grid.flatten(2).transpose(1, 2)
        else:
            table = self.table.reshape(1, 64, 24)
        return (tokens + table).square().sum(dim=(1, 2))


class NormedTokensPooled(nn.Module):
    """A layer norm over a channels_last map's channels, by permuting it to tokens and back
    (timm's ``LayerNorm2d``, CoAtNet's and ConvNeXt's), before a global average pool. The
    pool's backward hands an NCHW gradient, strided once permuted to tokens; the layer norm's
    backward kernels (CPU and CUDA) write their input gradient contiguous whatever they are
    given, so the map's gradient is channels_last again once permuted back, and the stem's
    convolution gets it so. ``norm=False`` scales the tokens by a learned vector instead, whose
    backward (an elementwise product) keeps the strided gradient: the convolution gets it NCHW
    and regains the format."""

    def __init__(self, norm: bool = True) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.norm = nn.LayerNorm(16) if norm else None
        self.scale = nn.Parameter(torch.ones(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.stem(x).permute(0, 2, 3, 1)
        tokens = self.norm(tokens) if self.norm is not None else tokens * self.scale
        return tokens.permute(0, 3, 1, 2).mean(dim=(2, 3))
