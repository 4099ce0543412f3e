"""Reports built from literal data, for unit tests of everything downstream of an audit."""

from __future__ import annotations

from dataclasses import replace

from cl_audit.enums import CostKind, Engine, Evidence, Phase
from cl_audit.errors import Stage
from cl_audit.report import (
    Conversion,
    Differential,
    DifferentialRun,
    DifferentialStatus,
    Environment,
    Finding,
    Mode,
    ModelReport,
    ModelRow,
    ModelSource,
    Producer,
    Provenance,
    Status,
    SweepReport,
    TensorMode,
    TensorSummary,
    summarise,
)
from cl_audit.report.verdict import Cost, CostSite, Gate
from cl_audit.rule.layout import MemoryLayout

ENVIRONMENT = Environment(
    tool="0.1.0",
    python="3.11.7",
    torch="2.14.1",
    torchvision="0.29.1",
    timm="1.0.31",
    device="cpu",
    dtype="float32",
    autocast=None,
    engine=Engine.DISPATCH,
    mode=TensorMode.EAGER,
)
CL_IN = TensorSummary((2, 8, 4, 4), (128, 1, 32, 8), "float32", "cpu", MemoryLayout.CHANNELS_LAST)
NCHW_OUT = TensorSummary((2, 8, 4, 4), (128, 16, 4, 1), "float32", "cpu", MemoryLayout.CONTIGUOUS)


def finding(
    python_op: str = "torch.cat",
    aten_op: str | None = "aten.cat",
    module_path: str = "stage2.1",
    call_site: str = "models/net.py:95",
    count: int = 1,
    round_trips: int = 1,
    provenance: Provenance = Provenance.BATCH,
    differential: Differential | None = None,
    root_cause: Producer | None = None,
) -> Finding:
    return Finding(
        kind=Conversion.LOSS,
        python_op=python_op,
        aten_op=aten_op,
        module_path=module_path,
        module_class="InvertedResidual",
        call_site=call_site,
        inputs=(CL_IN,),
        outputs=(NCHW_OUT,),
        count=count,
        bytes_converted=1024 * count,
        round_trips=round_trips,
        terminal=count - round_trips,
        mixed_formats=root_cause is not None,
        root_cause=root_cause,
        provenance=provenance,
        differential=differential,
    )


SHUFFLE = Producer("Tensor.contiguous", "aten.clone", "stage2.0", "InvertedResidual", "net.py:35")


def model_report() -> ModelReport:
    offenders = (
        finding(count=3, round_trips=3, root_cause=SHUFFLE),
        finding(
            "torch.flatten",
            "aten.clone",
            "",
            "models/net.py:120",
            round_trips=0,
            differential=Differential.CAUSED,
        ),
    )
    parameters = (finding("F.batch_norm", "aten.clone", "conv1", provenance=Provenance.PARAMETER),)
    neutral = (finding("F.softmax", "aten._softmax", "attn", round_trips=0),)
    return ModelReport(
        model="net",
        input_shape=(2, 3, 32, 32),
        environment=ENVIRONMENT,
        summary=summarise(120, 14, offenders, (), parameters, neutral),
        offenders=offenders,
        regains=(),
        parameter_conversions=parameters,
        format_neutral=neutral,
        differential=DifferentialRun(DifferentialStatus.RAN),
    )


def row(
    name: str,
    offenders: tuple[Finding, ...] = (),
    status: Status = Status.OK,
    source: ModelSource = ModelSource.TIMM,
    message: str | None = None,
) -> ModelRow:
    ok = status is Status.OK
    return ModelRow(
        name=name,
        source=source,
        status=status,
        mode=Mode.EAGER,
        input_shape=(2, 3, 224, 224) if ok else None,
        parameters=1000 if ok else None,
        summary=summarise(10, 5, offenders, ()) if ok else None,
        offenders=offenders,
        message=message,
        stage=None if ok or status is Status.SKIPPED else Stage.FORWARD,
        seconds=1.5,
        peak_memory_mb=None,
    )


def sweep(*rows: ModelRow, tool: str = "0.1.0") -> SweepReport:
    environment = Environment(**{**ENVIRONMENT.__dict__, "tool": tool})
    return SweepReport.build(environment, {"fake": False}, list(rows))


def cost_site(
    kind: CostKind,
    op: str = "torch.conv2d",
    aten_op: str | None = "aten.convolution_backward",
    phase: Phase = Phase.BACKWARD,
    module_path: str = "layer1.0.conv1",
    extra: int = 3 << 20,
) -> CostSite:
    return CostSite(
        kind=kind,
        phase=phase,
        op=op,
        aten_op=aten_op,
        module_path=module_path,
        module_class="Conv2d",
        call_site="models/net.py:40",
        channels_last_bytes=extra,
        nchw_bytes=0,
        channels_last_count=1,
        nchw_count=0,
    )


def costed_row(name: str, *sites: CostSite, written: int = 100 << 20) -> ModelRow:
    """A row whose verdict is its cost (``Gate``'s default: 1% and 1 MiB), with no offender
    finding: a training step whose only costs are copies inside kernels or of parameters."""
    extra = sum(s.extra for s in sites)
    gate = Gate()
    verdict = gate.verdict(extra, written, None)
    cost = Cost(gate, verdict, written, extra, 0, Evidence.MEASURED, sites)
    base = row(name)
    return replace(base, summary=replace(base.summary, verdict=verdict), cost=cost)


def training_sweep() -> SweepReport:
    """Offending only through kernel and parameter cost sites, as a CPU training sweep is."""
    environment = replace(ENVIRONMENT, train=True, optimizer="sgd")
    rows = [
        costed_row("resnet_kernel", cost_site(CostKind.KERNEL)),
        costed_row("nf_parameter", cost_site(CostKind.PARAMETER, "Tensor.reshape", "aten.clone")),
        costed_row("tiny_minor", cost_site(CostKind.KERNEL, extra=1 << 10)),
    ]
    return SweepReport.build(environment, {"fake": False, "train": True}, rows)


def minor_sweep() -> SweepReport:
    return sweep(costed_row("a", cost_site(CostKind.COPY, extra=1 << 10)), row("b"))


def empty_sweep() -> SweepReport:
    return sweep()


_V7_COST = ("batch", "fixed_bytes", "fixed_written_bytes", "per_sample_bytes",
            "per_sample_written_bytes", "at_gate")  # fmt: skip


def before_version_16(data: dict) -> dict:
    """A report's (or a sweep row's) JSON as versions before 16 wrote it: no compiled part in
    the speed section."""
    if data.get("speed") is not None:
        data = data | {"speed": {k: v for k, v in data["speed"].items() if k != "compiled"}}
    return data


def before_version_15(data: dict) -> dict:
    """A report's (or a sweep row's) JSON as versions before 15 wrote it: no cost groups, no
    sites' strides, no stages in the speed section."""
    data = before_version_16(data)
    if data.get("speed") is not None:
        data = data | {"speed": {k: v for k, v in data["speed"].items() if k != "stages"}}
    if data.get("cost") is None:
        return data
    cost = {k: v for k, v in data["cost"].items() if k != "groups"}
    cost["sites"] = [{k: v for k, v in site.items() if k != "strides"} for site in cost["sites"]]
    return data | {"cost": cost}


def before_version_13(data: dict) -> dict:
    """A report's (or a sweep row's) JSON as versions before 13 wrote it: no speed section,
    the gate on bytes alone, no kernel-copy table named in the cost."""
    data = {k: v for k, v in before_version_15(data).items() if k != "speed"}
    if data.get("cost") is None:
        return data
    cost = {k: v for k, v in data["cost"].items() if k != "kernel_copy_table"}
    cost["gate"] = {k: v for k, v in cost["gate"].items() if k not in ("on", "slowdown")}
    return data | {"cost": cost}


def before_version_11(data: dict) -> dict:
    """A report's JSON as versions before 11 wrote it: no DDP check, no FSDP pre-flight."""
    data = before_version_13(data)
    return {k: v for k, v in data.items() if k not in ("ddp", "fsdp")}


def before_version_10(data: dict) -> dict:
    """A report's JSON as versions before 10 wrote it: compiled graphs without the
    operation that made them traced on real values."""
    data = before_version_11(data)
    if data.get("compiled") is None:
        return data
    compiled = {k: v for k, v in data["compiled"].items() if k != "data_dependent"}
    return data | {"compiled": compiled}


def before_version_9(data: dict) -> dict:
    """A report's JSON as versions before 9 wrote it: cost sites without a root cause."""
    data = before_version_10(data)
    if data.get("cost") is None:
        return data
    sites = [{k: v for k, v in site.items() if k != "root_cause"} for site in data["cost"]["sites"]]
    return data | {"cost": data["cost"] | {"sites": sites}}


def before_version_8(data: dict) -> dict:
    """A report's JSON as versions before 8 wrote it: remedies without their status."""
    data = before_version_9(data)
    if data.get("cost") is None:
        return data
    cost = {k: v for k, v in data["cost"].items() if k != "verify_seconds"}
    cost["sites"] = [
        site
        | {
            "remedy": site["remedy"]
            and {k: site["remedy"][k] for k in ("pattern", "advice", "reference")}
        }
        for site in cost["sites"]
    ]
    return data | {"cost": cost}


def before_version_7(data: dict) -> dict:
    """A report's JSON as versions before 7 wrote it: no batch in the cost or its gate."""
    data = before_version_8(data)
    if data.get("cost") is None:
        return data
    cost = {k: v for k, v in data["cost"].items() if k not in _V7_COST}
    cost["gate"] = {k: v for k, v in cost["gate"].items() if k != "batch"}
    return data | {"cost": cost}
