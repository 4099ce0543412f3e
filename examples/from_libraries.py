"""Models from other libraries, each with its own example input: random weights from the
configurations the libraries ship, no download (YOLO_OFFLINE=1, HF_HUB_OFFLINE=1).

    cl-audit examples/from_libraries.py:unet --fake --device cuda --amp fp16
    cl-audit examples/from_libraries.py:yolo --train
"""

import torch


def unet():
    from diffusers import UNet2DConditionModel

    model = UNet2DConditionModel(
        sample_size=32,
        block_out_channels=(32, 64),
        layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=16,
    )
    example = {
        "sample": torch.randn(2, 4, 32, 32),
        "timestep": torch.tensor([10]),
        "encoder_hidden_states": torch.randn(2, 8, 32),
    }
    return model, example


def yolo():
    from ultralytics.nn.tasks import DetectionModel

    return DetectionModel("yolo11n.yaml", verbose=False), torch.randn(2, 3, 320, 320)
