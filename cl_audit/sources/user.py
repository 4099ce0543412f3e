"""The user's own model: ``package.module:factory`` or ``path/to/file.py:factory``.

The factory is called without arguments and returns an ``nn.Module``, a
``(module, input_shape)`` pair, where ``input_shape`` is per sample, like ``--input-size``:
``(3, 224, 224)`` for images, ``(3, 16, 112, 112)`` for clips, or a ``(module, example)``
pair, where ``example`` is the model's own input: a tensor, a tuple of positional arguments or
a dict of keyword arguments (batch and sizes are the example's own). A third element,
``loss``, gives the scalar ``loss(output)`` that a training audit (``--train``)
back-propagates.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from torch import nn

from cl_audit.enums import Stage
from cl_audit.errors import UsageError
from cl_audit.execution.inputs import example_of, is_shape
from cl_audit.rule.attribution import model_failed
from cl_audit.sources.refs import BuildOptions, LoadedModel

__all__ = ["build"]

_DEFAULT_SHAPE = (3, 224, 224)


def _import(target: str, spec: str) -> ModuleType:
    if target.endswith(".py") or os.sep in target:
        if not os.path.isfile(target):
            raise UsageError(f"{spec}: no such file {target!r}")
        # As ``python file.py`` does: the file's folder first on sys.path, so the file can import
        # its sibling modules.
        folder = os.path.dirname(os.path.abspath(target))
        if folder not in sys.path:
            sys.path.insert(0, folder)
        name = "cl_audit_user_" + os.path.splitext(os.path.basename(target))[0]
        file_spec = importlib.util.spec_from_file_location(name, target)
        if file_spec is None or file_spec.loader is None:
            raise UsageError(f"{spec}: cannot load {target!r} as Python")
        module = importlib.util.module_from_spec(file_spec)
        sys.modules[name] = module
        try:
            file_spec.loader.exec_module(module)
        except Exception as e:
            raise model_failed(Stage.IMPORT, spec, e) from e
        return module
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as e:
        if e.name and target.startswith(e.name):
            here = Path.cwd() / e.name.split(".")[0]
            hint = ""
            if here.is_dir() or here.with_suffix(".py").is_file():
                hint = (
                    f" (it is in the working folder, which cl-audit does not import from, "
                    f"as installed commands do not: `python -m` and pytest add it; run "
                    f"`PYTHONPATH=. cl-audit ...`, `python -m cl_audit ...`, or name the file: "
                    f"{target.replace('.', '/')}.py:{spec.rpartition(':')[2]})"
                )
            raise UsageError(f"{spec}: no module named {e.name!r}{hint}") from None
        raise model_failed(Stage.IMPORT, spec, e) from e
    except Exception as e:
        raise model_failed(Stage.IMPORT, spec, e) from e


def build(spec: str, options: BuildOptions) -> LoadedModel:
    """The factory runs as written: ``options`` do not apply to user code (no meta build, and
    the declared input shape is audited as declared, never capped)."""
    target, _, attribute = spec.rpartition(":")
    if not target or not attribute:
        raise UsageError(f"{spec!r}: expected module:factory or file.py:factory")
    factory = getattr(_import(target, spec), attribute, None)
    if not callable(factory):
        raise UsageError(f"{spec}: {target!r} has no callable {attribute!r}")
    try:
        made = factory()
    except ModuleNotFoundError as e:
        hint = f"the factory needs {e.name!r}: install it"
        hint += " (cl-audit's examples/libraries.py: pip install -e '.[libraries]')"
        raise model_failed(Stage.BUILD, spec, e, hint) from e
    except Exception as e:
        raise model_failed(Stage.BUILD, spec, e) from e
    loss = None
    if isinstance(made, tuple) and len(made) == 3:
        module, given, loss = made
    elif isinstance(made, tuple) and len(made) == 2:
        module, given = made
    else:
        module, given = made, _DEFAULT_SHAPE
    if not isinstance(module, nn.Module) or (loss is not None and not callable(loss)):
        raise UsageError(
            f"{spec}: the factory returned {type(made).__name__}; expected an nn.Module, a "
            "(module, input_shape or example) pair or a (module, input_shape or example, loss) "
            "triple"
        )
    if is_shape(given):
        return LoadedModel(spec, module, tuple(given), declared=True, loss=loss)
    try:
        example = example_of(given)
    except TypeError as e:
        raise UsageError(f"{spec}: {e}; or an input_shape such as (3, 224, 224)") from None
    first = example.first
    shape = () if first is None else tuple(first.shape)
    return LoadedModel(spec, module, shape, declared=True, loss=loss, example=example)
