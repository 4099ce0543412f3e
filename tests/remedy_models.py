"""Tiny modules for remedies proven by what-if runs (``cl_audit.phases.verify``): a change that
holds beside one that breaks the model, each at its own line."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class TwoCopies(nn.Module):
    """Two ``.contiguous()`` calls writing NCHW order: the first can go (the convolution after
    it takes either order: the output is the same, the copies gone); the second feeds a
    ``.view`` that flattens channels first, which needs NCHW order (dropping it, or writing
    channels_last, makes the view raise)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.after = nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Linear(8 * 16 * 16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.after(self.conv(x).contiguous())  # droppable
        flat = x.contiguous().view(x.shape[0], -1)  # needed by the view
        return self.head(flat)


class ShuffledByTorch(nn.Module):
    """Control for ``cost_models.Shuffle`` (ShuffleNet's channel shuffle written out): the same
    shuffle by ``F.channel_shuffle``: nothing to remedy on the CPU."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.after = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.after(F.channel_shuffle(self.stem(x), 2))


class AttentionFold(nn.Module):
    """coatnet's attention: heads read from a channels_last map as a view, transposed and made
    contiguous (where the NCHW data begins: a copy NCHW makes too), scaled, then transposed
    back and reshaped into the map, a copy writing NCHW order (the fix site of the convolution
    that converts it). Dropping the ``.contiguous()`` upstream makes that reshape a view in
    channels_last order: the change holds where the data began, not at the fix site
    (``flat``: the tokens are then viewed flat, which needs that copy: no change holds)."""

    def __init__(self, flat: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.after = nn.Conv2d(8, 8, 3, padding=1)
        self.flat = flat

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        n, c, h, w = x.shape
        heads = x.view(n, 2, c // 2, h * w)
        tokens = heads.transpose(-1, -2).contiguous()  # where the NCHW data begins
        if self.flat:
            tokens = tokens.view(n, -1).view(tokens.shape)
        tokens = tokens * 2.0
        return self.after(tokens.transpose(-1, -2).reshape(n, c, h, w))  # the fold


class CumulativeRows(nn.Conv2d):
    """The control for weight standardisation in memory order: the weight's rows transformed
    in an order-dependent way (a cumulative sum), so reading them in (kh, kw, in) order
    changes the weight; the change must be refuted."""

    def __init__(self) -> None:
        super().__init__(3, 16, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = self.weight.reshape(1, self.out_channels, -1)
        weight = F.batch_norm(rows.cumsum(-1), None, None, training=True).reshape_as(self.weight)
        return F.conv2d(x, weight, self.bias, self.stride, self.padding)


class PaddedBatch(nn.Module):
    """Images padded into a new batch, as torchvision's detection transform batches them:
    ``new_full`` allocates it in NCHW order, the channels_last images are copied in, and the
    convolution converts it back. ``flat=True`` also reads the batch through ``.view`` (it
    needs NCHW order): the control, where allocating it channels_last breaks the model."""

    def __init__(self, flat: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.flat = flat

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        batch = x.new_full((n, c, h + 2, w + 2), 0.0)  # the allocation
        batch[:, :, :h, :w].copy_(x)
        out = self.conv(batch)
        if self.flat:
            return out.sum() + batch.view(n, -1).sum()
        return out


class InstanceNormed(nn.Module):
    """An instance norm between convolutions (a U-Net's blocks): torch normalises it as a batch
    norm of a (1, N*C, H, W) reshape, which copies channels_last data to NCHW order.
    ``tracked=True`` keeps running statistics, which the audit's eval forward uses: a group norm
    cannot stand in for them, and the change must not be made (the control). ``volumes=True``:
    the same in 3-D (a MONAI network's blocks), channels_last_3d."""

    def __init__(self, tracked: bool = False, volumes: bool = False) -> None:
        super().__init__()
        conv, norm = (nn.Conv3d, nn.InstanceNorm3d) if volumes else (nn.Conv2d, nn.InstanceNorm2d)
        self.a = conv(3, 16, 3, padding=1)
        self.norm = norm(16, affine=True, track_running_stats=tracked)
        self.b = conv(16, 16, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.norm(self.a(x)))  # the instance norm


class ChannelSoftmax(nn.Module):
    """A softmax between convolutions (a keypoint detector's score map): over the channels
    (``dim=1``) the kernel writes NCHW order, and taking it over the last dimension of the
    channels-last view copies nothing. ``dim=-1`` (over the width, the control) copies too, but
    the channels are not its dimension: the change must not be made."""

    def __init__(self, dim: int = 1, log: bool = False) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 16, 3, padding=1)
        self.b = nn.Conv2d(16, 16, 3, padding=1)
        self.dim, self.log = dim, log

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        y = F.log_softmax(y, self.dim) if self.log else y.softmax(dim=self.dim)  # the softmax
        return self.b(y)


SOBEL = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]])


class PlaneFilter(nn.Module):
    """Each channel filtered with one kernel by merging batch and channels (an image library's
    gradient filter): ``x.reshape(b * c, 1, h, w)`` copies channels_last data to NCHW order, a
    replicate pad and a convolution with a (2, 1, 3, 3) kernel, then back to (b, c, 2, h, w).
    ``pooled=True`` (the control) averages each plane instead of filtering it: no convolution
    stands in for that, and the change must be refuted."""

    def __init__(self, pooled: bool = False) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 8, 3, padding=1)
        self.register_buffer("kernel", torch.stack([SOBEL, SOBEL.t()])[:, None])
        self.pooled = pooled

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        b, c, h, w = y.shape
        planes = y.reshape(b * c, 1, h, w)  # the merge
        if self.pooled:
            return self.b(y) * planes.mean((1, 2, 3)).view(b, c, 1, 1)
        edges = F.conv2d(F.pad(planes, [1, 1, 1, 1], mode="replicate"), self.kernel)
        return self.b(edges.reshape(b, c, 2, h, w).abs().sum(2))


class NewUserNet(nn.Module):
    """A small model written the way people write them (issue #67): a convolution, a group
    norm, a bilinear upsampling, ``torch.cat`` of the map with a fresh ``torch.ones`` mask
    (NCHW: the factory's default), a per-channel filter by ``reshape(b * c, 1, h, w)``, an
    instance norm and a softmax over the channels. ``mask_like=True`` makes the mask in the
    map's layout (``torch.ones_like(y[:, :1])``): the control, whose cat keeps channels_last."""

    def __init__(self, mask_like: bool = False) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 15, 3, padding=1)
        self.gn = nn.GroupNorm(5, 15)
        self.b = nn.Conv2d(16, 16, 3, padding=1)
        self.c = nn.Conv2d(16, 16, 3, padding=1)
        self.norm = nn.InstanceNorm2d(16, affine=True)
        self.d = nn.Conv2d(16, 8, 3, padding=1)
        self.register_buffer("kernel", SOBEL[None, None].clone())
        self.mask_like = mask_like

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.interpolate(self.gn(self.a(x)), scale_factor=2.0, mode="bilinear")
        b, _, h, w = y.shape
        if self.mask_like:
            mask = torch.ones_like(y[:, :1])
        else:
            mask = torch.ones(b, 1, h, w, dtype=y.dtype, device=y.device)  # the mask
        y = self.b(torch.cat([y, mask], 1))  # the cat
        c = y.shape[1]
        planes = F.conv2d(y.reshape(b * c, 1, h, w), self.kernel, padding=1)  # the filter
        y = self.norm(self.c(planes.reshape(b, c, h, w)))  # the instance norm
        return self.d(y).softmax(dim=1)  # the softmax


class DroppedInstanceNorm(InstanceNormed):
    """``InstanceNormed`` with a dropout of the first convolution's map: in training its mask is
    drawn in the map's memory order, so the two layouts' unchanged steps differ and no change
    can be held to either (``p=0`` draws nothing: the control)."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.dropout(self.a(x), self.p, self.training)
        return self.b(self.norm(y))  # the instance norm
