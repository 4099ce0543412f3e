"""Which registry models hold 4-D or 5-D parameters or buffers that the channels_last conversion
restrides and that no convolution module owns as its weight: the candidates of issue #59's
"keep it as it was" remedy (``cl_audit.compare.kept``), whose reports can gain that lead.

    python scripts/restrided_tensors.py --out reports/restrided-tensors_torch-2.14.1.json

Each model is built with random weights (timm's on the meta device: no memory, no values
needed to read strides), converted as an audit converts it (``to_channels_last``), and its
candidates listed as the verify phase lists them (``restrided``: the 4 largest), with the
convolution weights read here from the modules (``nn.Conv*``; an audit reads them from the
convolutions' weight arguments instead). Written whole at the end.
"""

from __future__ import annotations

import argparse
import gc
import json
import warnings
from pathlib import Path

import timm
import torch
import torchvision
from torch import nn

from cl_audit.compare.kept import restrided
from cl_audit.execution.convert import to_channels_last
from cl_audit.report.files import write_text


def _candidates(model: nn.Module) -> tuple[str, ...]:
    to_channels_last(model)
    convs = {
        f"{n}.weight" for n, m in model.named_modules() if isinstance(m, nn.modules.conv._ConvNd)
    }
    return restrided(model, frozenset(convs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    found: dict[str, dict[str, list[str]]] = {"torchvision": {}, "timm": {}}
    for name in torchvision.models.list_models():
        try:
            model = torchvision.models.get_model(name, weights=None, weights_backbone=None)
        except TypeError:
            model = torchvision.models.get_model(name, weights=None)
        if kept := _candidates(model):
            found["torchvision"][name] = list(kept)
    for name in timm.list_models():
        try:
            with torch.device("meta"):
                model = timm.create_model(name, pretrained=False)
        except Exception:  # a model timm cannot build on the meta device: not scanned
            continue
        if kept := _candidates(model):
            found["timm"][name] = list(kept)
        del model
        gc.collect()
    result = {"torch": torch.__version__, "timm": timm.__version__, "models": found}
    write_text(args.out, json.dumps(result, indent=1) + "\n", "--out")


if __name__ == "__main__":
    main()
