"""A timm model with a fixed input size (a position table, a token-mixing MLP) is built for the
input it will be given: ``--input-size`` as for a cap (found by the compiled proof: gmixer_24_224,
swinv2_tiny_window8_256 and vit_relpos_small_patch16_224 failed at 160 px)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from cl_audit.cli import app
from cl_audit.enums import ModelSource
from cl_audit.sources import BuildOptions, ModelRef, load_model

FIXED = ModelRef(ModelSource.TIMM, "test_vit3")  # 0.9M parameters, fixed_input_size, 160 px
ANY_SIDE = ModelRef(ModelSource.TIMM, "test_resnet")  # convolutions only: any side


def _side(loaded) -> tuple[int, int]:
    return tuple(loaded.module.patch_embed.img_size)


def test_a_fixed_size_timm_model_is_built_for_the_input_size_given():
    loaded = load_model(FIXED, BuildOptions(input_size=(3, 96, 96)))
    assert _side(loaded) == (96, 96) and loaded.input_shape == (3, 96, 96)
    assert not loaded.capped  # the user's size, not a cap: a sweep does not retry it bigger


def test_without_an_input_size_the_model_keeps_its_own_side_or_the_cap():
    assert _side(load_model(FIXED)) == (160, 160)
    capped = load_model(FIXED, BuildOptions(max_input_size=64))
    assert _side(capped) == (64, 64) and capped.capped


def test_a_model_that_runs_any_side_is_built_as_it_is():
    loaded = load_model(ANY_SIDE, BuildOptions(input_size=(3, 96, 96)))
    assert loaded.input_shape == (3, 96, 96)


def test_the_cli_audits_a_fixed_size_timm_model_at_the_input_size_given():
    result = CliRunner().invoke(
        app,
        ["--timm", "test_vit3", "--input-size", "3x96x96", "--json", "-"],
        catch_exceptions=False,
    )
    assert result.exit_code in (0, 1), result.output  # 3 was: "Input height (96) doesn't match"
    assert json.loads(result.stdout)["input_shape"] == [2, 3, 96, 96]
