"""Draw models at random for the speed checks, the seed written.

    python scripts/draw_models.py --timm 44 --seed 58 --max-parameters 60e6 --max-size 256 \
        --from reports/timm_torch-2.14.1_cuda_train_predicted.json.gz \
        > reports/speed/models_cuda.txt

From the rows of a sweep report that ran (status ok), those with at most ``--max-parameters``
parameters whose timm configuration's input side is at most ``--max-size``; ``--named`` are
listed first (not drawn), and are not drawn again; the models of the ``--exclude`` lists (an
earlier check's) are not drawn either.

    python scripts/draw_models.py --timm 45 --seed 66 --max-parameters 30e6 \
        --from reports/timm_torch-2.14.1_cpu_fake.json.gz \
        --exclude reports/speed/models_cpu.txt reports/speed/models_cuda.txt \
        > reports/speed/models_cpu_held_out.txt

With ``--torchvision N --torchvision-from REPORT``, N torchvision classification models
(``torchvision.models.list_models(module=torchvision.models)``) that ran in that sweep with at
most ``--max-parameters`` are drawn too, with the same seed, listed first as ``tv:NAME``:

    python scripts/draw_models.py --timm 26 --torchvision 10 --seed 69 --max-parameters 30e6 \
        --from reports/timm_torch-2.14.1_cpu_fake.json.gz \
        --torchvision-from reports/torchvision_torch-2.14.1_cpu_eager.json.gz \
        > reports/compiled/models_cpu.txt
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
from pathlib import Path

import timm


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--from", dest="report", type=Path, required=True)
    p.add_argument("--timm", type=int, required=True, help="how many to draw")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--max-parameters", type=float, default=60e6)
    p.add_argument("--max-size", type=int, default=256)
    p.add_argument("--named", default="")
    p.add_argument("--exclude", type=Path, nargs="*", default=[], help="model lists")
    p.add_argument("--torchvision", type=int, default=0, help="how many torchvision to draw")
    p.add_argument("--torchvision-from", type=Path, help="a torchvision sweep report")
    a = p.parse_args()
    excluded = {
        line.split("#")[0].strip().removeprefix("tv:")
        for path in a.exclude
        for line in path.read_text().splitlines()
    }
    opener = gzip.open if a.report.suffix == ".gz" else open
    with opener(a.report, "rt") as f:
        rows = json.load(f)["models"]
    named = [n for n in a.named.split(",") if n]

    def fits(row: dict) -> bool:
        if row["status"] != "ok" or row["parameters"] > a.max_parameters or row["name"] in named:
            return False
        if row["name"] in excluded:
            return False
        cfg = timm.models.get_pretrained_cfg(row["name"])
        return cfg is not None and max(cfg.input_size[1:]) <= a.max_size

    pool = sorted(r["name"] for r in rows if fits(r))
    rng = random.Random(a.seed)
    vision = _torchvision(a, rng) if a.torchvision else []
    drawn = rng.sample(pool, a.timm)
    print(
        f"# scripts/draw_models.py --from {a.report} --timm {a.timm} --seed {a.seed} "
        f"--max-parameters {a.max_parameters:g} --max-size {a.max_size} --named {a.named}"
        + (f" --exclude {' '.join(map(str, a.exclude))}" if a.exclude else "")
    )
    if a.torchvision:
        print(f"# --torchvision {a.torchvision} --torchvision-from {a.torchvision_from}")
    print(f"# {a.timm} drawn of {len(pool)}; named first")
    for name in named:
        print(f"{name}  # named")
    for name in vision:
        print(f"tv:{name}")
    for name in drawn:
        print(name)


def _torchvision(a: argparse.Namespace, rng: random.Random) -> list[str]:
    import torchvision

    classification = set(torchvision.models.list_models(module=torchvision.models))
    with gzip.open(a.torchvision_from, "rt") as f:
        rows = json.load(f)["models"]
    pool = sorted(
        r["name"]
        for r in rows
        if r["name"] in classification
        and r["status"] == "ok"
        and r["parameters"] <= a.max_parameters
    )
    return rng.sample(pool, a.torchvision)


if __name__ == "__main__":
    main()
