"""Tiny modules for the cost rule (``compare.cost_sites``): each case beside its control."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class TransposeCopy(nn.Module):
    """``transpose(2, 3).contiguous()``: both formats copy the same bytes here, and nothing
    converts the result back: no channels_last-only cost (the old rule called it caused)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).transpose(2, 3).contiguous().sum((2, 3))


class ContiguousCopy(nn.Module):
    """Positive control: ``.contiguous()`` of a channels_last map copies only in channels_last,
    and the next convolution converts it back."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.after = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.after(self.conv(x).contiguous())


class Shuffle(nn.Module):
    """A channel shuffle: the ``.contiguous()`` of the 5D view copies in both formats alike (not
    a site), and the convolution after it converts the NCHW-ordered result back (the site, with
    the shuffle's copy as its fix site)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.after = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        n, c, h, w = x.shape
        x = x.view(n, 2, c // 2, h, w).transpose(1, 2).contiguous().view(n, c, h, w)
        return self.after(x)


class StdConv(nn.Conv2d):
    """Weight standardisation (timm's ``StdConv2d``): the weight is reshaped and normalised
    every forward, a copy of a channels_last weight, converted back by the convolution."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = F.batch_norm(
            self.weight.reshape(1, self.out_channels, -1), None, None, training=True, eps=1e-6
        ).reshape_as(self.weight)
        return F.conv2d(x, weight, self.bias, self.stride, self.padding)


class Standardised(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = StdConv(16, 64, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class Plain(nn.Module):
    """The control of ``Standardised``: the same convolution, not standardised."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(16, 64, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class PermutedCopy(nn.Module):
    """``permute(0, 2, 3, 1).contiguous()`` of a map: NCHW copies, channels_last is already in
    that order (a site where channels_last saves bytes: it gets no remedy)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).permute(0, 2, 3, 1).contiguous()


class PositionTokens(nn.Module):
    """A 4-D position embedding laid out (1, rows, columns, dim) as naflexvit's ``pos_embed``,
    made channels_last with the model and reshaped to tokens: a parameter copy with no
    convolution and no standardisation; the weight-standardisation remedy does not fit it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 8, stride=8)
        self.pos = nn.Parameter(torch.randn(1, 4, 4, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.conv(x).permute(0, 2, 3, 1).flatten(1, 2)
        return tokens + self.pos.reshape(1, 16, 8)


class TokenSoftmax(nn.Module):
    """A softmax over the flattened map's positions: ``flatten(2)`` of a channels_last map is
    a strided 3-D view, which the CPU softmax kernel copies contiguous first (measured by the
    profiler); of an NCHW map it is contiguous."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.conv(x).flatten(2), dim=-1)


class TokenCumsum(nn.Module):
    """A running sum over the flattened map's positions: the same strided 3-D view of a
    channels_last map as ``TokenSoftmax``'s, which the CUDA ``cumsum`` kernel copies first
    (measured on an H200, torch 2.11) and the CPU one reads as it lies (measured, torch 2.4.1
    to 2.15.0)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).flatten(2).cumsum(-1)


class TokenBmm(nn.Module):
    """The control for ``TokenSoftmax``: the same strided tokens multiplied by a matrix; the
    CPU ``bmm`` reads a transposed matrix as it lies (measured: no copy inside)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.proj = nn.Parameter(torch.randn(1, 32 * 32, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.conv(x).flatten(2)
        return torch.bmm(tokens, self.proj.expand(tokens.shape[0], -1, -1))


class MeanHead(nn.Module):
    """A global pool by ``mean((2, 3))``: in training its backward expands an NCHW gradient,
    a small cost."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.fc = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(F.relu(self.conv(x)).mean((2, 3)))


class LayerNorm2d(nn.Module):
    """timm's LayerNorm2d: permute, normalise, permute back: views around a kernel, no copy in
    channels_last (the NCHW run copies inside ``layer_norm``: a saving)."""

    def __init__(self, channels: int = 8, copy: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, channels, 3, padding=1)
        self.norm = nn.LayerNorm(channels)
        self.after = nn.Conv2d(channels, channels, 3, padding=1)
        self.copy = copy

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.conv(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        if self.copy:  # the positive control: a real copy writing NCHW order
            x = x.contiguous()
        return self.after(x)


class MixedAdd(nn.Module):
    """A residual add of a channels_last map and an NCHW one (the pooled branch, NCHW on CPU):
    strided reads, counted apart from the cost."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        branch = torch.ones(x.shape, dtype=x.dtype)  # made NCHW whatever the format
        return x + branch


class TokensAsMap(nn.Module):
    """Tokens written in (B, C, HW) order by a batched matmul and viewed as a map: the view
    moves nothing, so it is never the fix site of the convolution that converts the map."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.mix = nn.Parameter(torch.randn(8, 8))
        self.after = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        n, c, h, w = x.shape
        tokens = torch.matmul(self.mix, x.reshape(n, c, h * w))  # (n, c, hw): NCHW order
        return self.after(tokens.view(n, c, h, w))


class MetadataFill(nn.Module):
    """``new_full`` of a channels_last map: it reads the map's dtype and device, not its data."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        n, _, h, w = x.shape
        return x.new_full((n, h * w), 2.0) + x.flatten(2).sum(1)


class Unfolded(nn.Module):
    """Positive control of ``MetadataFill``: ``unfold`` (im2col) reads the channels_last data
    and returns no map, converting it inside its kernel."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.unfold(self.conv(x), 2, stride=2)


class HeldScales(nn.Module):
    """A plain tensor attribute iterated for fill values (Ultralytics' detection head does so
    with ``self.stride``)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.scales = torch.tensor([2.0, 4.0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        n, _, h, w = x.shape
        fills = [x.new_full((n, h * w), s) for s in self.scales]
        return torch.cat(fills, 1) + x.flatten(2).sum(1).repeat(1, len(fills))


class ReadsInput(nn.Module):
    """Positive control of ``HeldScales``: a fill value read from the batch itself."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        return x.new_full((2, 4), x.amax().item())


class StandardisedThenCopy(nn.Module):
    """Both kinds of cost: the standardised weight's copies (paid once a forward, whatever the
    batch) and a ``.contiguous()`` of the activations (paid per sample)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = StdConv(16, 64, 3, padding=1)
        self.after = nn.Conv2d(64, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.after(self.conv(x).contiguous())


class Folded(nn.Module):
    """halonet's attention: the map cut into heads (a copy in NCHW order: the loss), the tokens
    rewritten, then folded back into a map by ``.contiguous().view()``, which writes NCHW order,
    with a ReLU and a pool after it that keep that order. The fold, not the cut, is the fix site
    of the convolution that converts the map (``fold_channels_last``: the fold writes
    channels_last order, and the convolution converts nothing)."""

    def __init__(self, fold_channels_last: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.after = nn.Conv2d(8, 8, 3, padding=1)
        self.fold_channels_last = fold_channels_last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        n, c, h, w = x.shape
        heads = x.reshape(n * 2, c // 2, h * w)  # the cut: batch and heads merged, a copy
        tokens = heads.transpose(1, 2).contiguous()  # (n * 2, hw, c / 2) order
        if self.fold_channels_last:  # written (n, h, w, c), viewed as the map
            out = tokens.view(n, 2, h, w, c // 2).permute(0, 2, 3, 1, 4).reshape(n, h, w, c)
            out = out.permute(0, 3, 1, 2)
        else:
            out = tokens.transpose(1, 2).contiguous().view(n, c, h, w)  # the fold
        return self.after(F.max_pool2d(torch.relu(out), 3, 1, 1))


class NormThenTokens(nn.Module):
    """efficientvim's mixer: timm's LayerNorm2d (its ``layer_norm`` output, permuted back, is
    read in channels_last order), the map flattened to tokens as a view, a ``Conv1d`` writing
    (B, C, HW) order, viewed as a map for a depthwise convolution. The ``Conv1d`` is the fix
    site of the convolution's conversion, not the layer norm."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.LayerNorm(8)
        self.proj = nn.Conv1d(8, 8, 1)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.conv(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        n, c, h, w = x.shape
        return self.dw(self.proj(x.flatten(2)).reshape(n, c, h, w))


class TokensLinear(nn.Module):
    """ViT-style tokens, ``flatten(2).transpose(1, 2)``, through a Linear with a bias:
    contiguous from a channels_last map, so ``addmm`` runs (it writes the bias into its output
    first, a broadcast copy); strided from an NCHW map, so ``bmm`` and ``add`` run. Both write
    as many bytes: no conversion either way."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x).flatten(2).transpose(1, 2))


class ChannelSlice(nn.Module):
    """A channel slice of a channels_last map between two convolutions (dpn's dual paths): its
    backward, ``slice_backward``, returns an NCHW gradient that the first convolution's
    backward converts."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.after = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.after(self.conv(x)[:, :8])


class TokensBackToMap(nn.Module):
    """Tokens with a class token, the class token sliced off and the rest folded back into a
    map for the next convolution, as timm's CoaT does (``remove_cls``, then reshape, permute,
    ``contiguous``). In the backward the slice's gradient is contiguous where the map is
    channels_last and strided where it is NCHW; ``slice_backward`` copies it into a zero
    tensor either way (on the CPU a ``copy_`` into a slice of it). ``softmax=True`` adds a
    softmax over the channels of the channels_last map's permuted tokens (strided in the
    channels_last run only), which the CPU kernel makes contiguous first: a copy in one run."""

    def __init__(self, softmax: bool = False) -> None:
        super().__init__()
        self.softmax = softmax
        self.embed = nn.Conv2d(3, 16, 2, stride=2)
        self.cls = nn.Parameter(torch.zeros(1, 1, 16))
        self.mix = nn.Linear(16, 16)
        self.conv = nn.Conv2d(16, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        grid = self.embed(x)
        h, w = grid.shape[2:]
        tokens = grid.flatten(2).transpose(1, 2)
        tokens = self.mix(torch.cat((self.cls.expand(b, -1, -1), tokens), dim=1))
        grid = tokens[:, 1:, :].reshape(b, h, w, -1).permute(0, 3, 1, 2).contiguous()
        out = self.conv(grid)
        if self.softmax:
            out = out.flatten(2).softmax(dim=1)
        return out.sum(dim=-1)


class ListIndexAfterConstants(nn.Module):
    """Constants the model makes and drops (``torch.ones``: parameter-derived, made of no data
    in its code), each followed by an index from a Python list (``x[:, [...]]``): torch makes
    that index tensor outside any operation an audit sees, and on fake CUDA copies it to the
    device (``_to_copy``), the same copy in both formats; its storage can take a dropped
    constant's identity. Positive control: ``torch.arange(...).to(device)``, an index the
    model's code makes by an operation, is parameter-derived (a constant) in both."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        order = [1, 0, *range(2, 8)]
        for _ in range(16):
            torch.ones(8, device=x.device)  # a constant, dropped at once
            x = x[:, order]
        made = torch.arange(8).flip(0).to(x.device)
        return x[:, made]
