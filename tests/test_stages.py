"""The model's stages (the page's picture): the module tree's cut, each stage's predicted and
measured time in both layouts, each stage's channels_last-only bytes, and the picture drawn."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch
from torch import nn
from torch_checks import BACKWARD_PROBLEM

from cl_audit.enums import SpeedBasis, TensorMode
from cl_audit.execution.settings import AuditSettings
from cl_audit.phases.audit_module import audit_module
from cl_audit.render.html_model import model_html
from cl_audit.render.html_stages import costliest, stages_section
from cl_audit.report import ModelReport, load_schema
from cl_audit.report.stages import BACKWARD, OPTIMIZER, ROOT, StageCut, StageTime, stage_cut


def _paths(model: nn.Module) -> list[str]:
    return [name for name, _ in model.named_modules()]


def test_the_cut_is_the_deepest_depth_of_at_most_thirty_parts():
    model = nn.Sequential()
    model.add_module("stem", nn.Conv2d(3, 8, 3))
    blocks = nn.Sequential(*(nn.Sequential(nn.Conv2d(8, 8, 1), nn.ReLU()) for _ in range(6)))
    model.add_module("blocks", blocks)
    model.add_module("head", nn.Linear(8, 2))
    cut = stage_cut(_paths(model))  # depth 1 gives 3 parts, 2 gives 8, 3 gives 14
    assert len(cut.parts) == 14 and cut.parts[:3] == ("stem", "blocks.0.0", "blocks.0.1")
    assert cut.of("blocks.3.1") == "blocks.3.1" and cut.of("stem") == "stem"
    assert cut.of(None) == ROOT and cut.of("") == ROOT and cut.of("elsewhere") == ROOT
    assert cut.of("blocks.2") == "blocks.2"  # above the cut: a stage of its own operations
    assert cut.ordered([ROOT, "head", "blocks.2", "stem", "blocks.0.1"]) == [
        "stem", "blocks.0.1", "blocks.2", "head", ROOT
    ]  # fmt: skip
    coarse = stage_cut(_paths(model), most=10)  # 14 is too many: depth 2
    assert coarse.parts == ("stem", *(f"blocks.{i}" for i in range(6)), "head")
    assert coarse.of("blocks.3.1") == "blocks.3"  # a module below the cut: its part's


def test_a_first_depth_of_more_than_thirty_parts_merges_neighbours():
    long = nn.Sequential(*(nn.Sequential(nn.Conv2d(4, 4, 1), nn.ReLU()) for _ in range(70)))
    cut = stage_cut(_paths(long))
    assert len(cut.parts) <= 30 and cut.parts[0] == "0-2" and cut.parts[-1] == "69"
    assert cut.of("4.1") == "3-5" and cut.of("69.0") == "69"
    tiny = nn.Sequential(nn.Conv2d(3, 4, 1), nn.Sequential(nn.ReLU(), nn.Conv2d(4, 4, 1)))
    assert stage_cut(_paths(tiny)).parts == ("0", "1.0", "1.1")  # its modules


class Shuffle(nn.Module):
    """The channel shuffle's copy: a 5D view of channels_last data copied out contiguous."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        return x.view(n, 2, c // 2, h, w).transpose(1, 2).contiguous().view(n, c, h, w)


class Stages(nn.Module):
    """Five stages; the third copies its channels_last input out NCHW, so the fourth's
    convolution converts it back (the cost site, in the stage that pays it)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.a = nn.Conv2d(8, 8, 3, padding=1)
        self.b = Shuffle()
        self.c = nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.c(self.b(self.a(self.stem(x))))).mean()


def _audit(**settings: object):
    model, x = Stages(), torch.randn(2, 3, 24, 24)
    return audit_module(model, (x,), AuditSettings(timeline=True, **settings))


@pytest.mark.parametrize("train", [False, True], ids=["forward", "training"])
def test_predicted_stages_add_up_to_each_step_and_hold_the_sites_bytes(train):
    # a training step eagerly where this torch refuses a fake one (2.4): predicted all the same
    fake = not train or BACKWARD_PROBLEM is None
    report = _audit(train=train, tensor_mode=TensorMode.FAKE if fake else TensorMode.EAGER)
    speed = report.speed
    assert speed is not None and speed.basis is SpeedBasis.PREDICTED
    names = [s.name for s in speed.stages]
    assert names[:5] == ["stem", "a", "b", "c", "head"]
    # a predicted backward's time lies in the stages whose forward made it
    assert (OPTIMIZER in names) is train and BACKWARD not in names
    step = sum(s.channels_last_ms for s in speed.stages), sum(s.nchw_ms for s in speed.stages)
    assert step == pytest.approx((speed.channels_last.ms, speed.nchw.ms), rel=1e-3)
    extra = {s.name: s.extra_bytes for s in speed.stages}
    assert sum(extra.values()) == report.cost.extra_bytes > 0  # every site in one stage
    assert costliest(speed.stages).name == "c"  # converting b's copy back (and its gradient)
    if not train:  # the control: the other stages copy nothing (a training step's gradient,
        # NCHW from the shuffle's backward, converts in a's and head's backward too)
        assert extra["c"] > 0 and all(extra[n] == 0 for n in ("stem", "a", "b", "head"))


def test_measured_stages_are_the_profiled_operations_own_time():
    report = _audit(time=True)
    speed = report.speed
    assert speed.basis is SpeedBasis.MEASURED
    by_class = sum(c.channels_last_ms for c in speed.classes)
    assert sum(s.channels_last_ms for s in speed.stages) == pytest.approx(by_class, rel=1e-3)
    assert {"stem", "a", "b", "c", "head"} <= {s.name for s in speed.stages}
    assert {s.name: s.extra_bytes for s in speed.stages}["c"] == report.cost.extra_bytes


def test_without_the_timeline_no_stages_are_recorded():
    model, x = Stages(), torch.randn(2, 3, 24, 24)
    report = audit_module(model, (x,), AuditSettings(tensor_mode=TensorMode.FAKE))
    assert report.speed.known and report.speed.stages == ()
    assert "recorded when the audit is run with --html" in stages_section(report.speed)


def test_the_stages_survive_the_json_and_the_picture_draws_a_bar_pair_each():
    report = _audit(tensor_mode=TensorMode.FAKE)
    speed = report.speed
    data = json.loads(json.dumps(report.to_dict()))
    jsonschema.validate(data, load_schema())  # the shipped schema holds them
    again = ModelReport.from_dict(data)
    assert again.speed.stages == speed.stages and len(speed.stages) >= 5
    page = model_html(report)
    svg = re.search(r'<svg id="stages-picture".*?</svg>', page, re.S).group(0)
    assert svg.count('class="bar cl"') == svg.count('class="bar nchw"') == len(speed.stages)
    assert re.search(r'<g class="stage costliest" data-stage="c">', svg)
    assert "<script" not in svg


def test_a_stage_marked_by_time_only_where_no_stage_copies():
    stages = (StageTime("a", 1.0, 2.0), StageTime("b", 3.0, 2.0), StageTime("c", 1.0, 1.0))
    assert costliest(stages).name == "b"  # channels_last loses most time there
    assert costliest((StageTime("a", 1.0, 2.0),)) is None  # it loses no time anywhere
    assert StageCut(("x",), (("x", "x"),)).of("x.y.z") == "x"


class Above(nn.Module):
    """A module whose own operation (the doubling) runs beside its child's: above the cut."""

    def __init__(self) -> None:
        super().__init__()
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(x * 2)


@pytest.mark.parametrize("time", [False, True], ids=["predicted", "measured"])
def test_a_module_above_the_cut_is_a_stage_of_its_own_operations_both_ways(time):
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 1), Above(),
                          nn.Conv2d(8, 8, 1), nn.Conv2d(8, 4, 1))  # fmt: skip
    settings = AuditSettings(timeline=True, time=time)
    report = audit_module(model, (torch.randn(2, 3, 24, 24),), settings)
    names = [s.name for s in report.speed.stages]
    assert names[:6] == ["0", "1", "2", "2.act", "3", "4"]  # the doubling in "2", not the root
