"""The source files a model's audit ran through, and their content digests.

A sweep's cache (``cl_audit.sweep.cache``) reuses a row only while these files are unchanged.
They are read statically in the worker, after the audit, from what is loaded: the file of every
class in every module's MRO, the file of every call site the audit recorded, the factory's file,
and, for each of those, the files it imports from its own package (one level: the classes,
functions and modules named in its namespace). Helpers called from a model's ``forward`` live
there. Files of torch, of cl-audit and of the standard library are left out: the versions in the
cache key cover them. Python 3.12's ``sys.monitoring`` could list every executed file at no
cost; Python 3.10 and 3.11 have nothing as cheap, so the list is read statically everywhere.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import site
import sys
import sysconfig
from collections.abc import Iterable
from pathlib import Path
from types import FunctionType, ModuleType

import torch
from torch import nn

from cl_audit.enums import ModelSource
from cl_audit.report import ModelRow
from cl_audit.sources import ModelRef, library

__all__ = ["FileDigests", "call_site_files", "factory_files", "module_files", "portable"]

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _folders(*paths: str) -> tuple[str, ...]:
    return tuple(os.path.realpath(path) + os.sep for path in paths)


_COVERED_BY_VERSIONS = _folders(os.path.dirname(torch.__file__), _PACKAGE_DIR)
_STANDARD_LIBRARY = _folders(sysconfig.get_paths()["stdlib"])
_INSTALLED = _folders(*site.getsitepackages(), sysconfig.get_paths()["purelib"])


def portable(path: str) -> str:
    """A file's name as a cache entry keeps it: relative to the working directory (``./``)
    when it lies there, so a checkout restored elsewhere still matches, else absolute."""
    real = os.path.realpath(path)
    cwd = os.path.realpath(os.getcwd()) + os.sep
    return "./" + real[len(cwd) :] if real.startswith(cwd) else real


def _resolve(name: str) -> str:
    return os.path.join(os.getcwd(), name[2:]) if name.startswith("./") else name


def _kept(path: str | None) -> str | None:
    """The real path of a Python source file that the versions do not already cover."""
    if not path or not path.endswith(".py"):
        return None
    real = os.path.realpath(path)
    standard = real.startswith(_STANDARD_LIBRARY) and not real.startswith(_INSTALLED)
    if standard or real.startswith(_COVERED_BY_VERSIONS) or not os.path.isfile(real):
        return None
    return real


class _Modules:
    """Loaded Python modules by their real file path, read once per process."""

    def __init__(self) -> None:
        self.by_file: dict[str, ModuleType] = {}
        for module in list(sys.modules.values()):
            file = getattr(module, "__file__", None)
            if isinstance(file, str):
                self.by_file.setdefault(os.path.realpath(file), module)

    def imports(self, file: str) -> set[str]:
        """The files of the classes, functions and modules ``file``'s module names, within its
        own package (the folder of its top-level package, or its own folder)."""
        module = self.by_file.get(file)
        if module is None:
            return set()
        top = sys.modules.get(module.__name__.partition(".")[0])
        top_file = getattr(top, "__file__", None)
        packaged = top is not None and hasattr(top, "__path__") and isinstance(top_file, str)
        root = os.path.dirname(os.path.realpath(top_file if packaged else file)) + os.sep
        found: set[str] = set()
        for value in list(vars(module).values()):
            if isinstance(value, ModuleType):
                source = getattr(value, "__file__", None)
            elif isinstance(value, (type, FunctionType)):
                owner = sys.modules.get(getattr(value, "__module__", None) or "")
                source = getattr(owner, "__file__", None)
            else:
                continue
            kept = _kept(source if isinstance(source, str) else None)
            if kept is not None and kept.startswith(root):
                found.add(kept)
        return found


def _with_imports(files: Iterable[str]) -> set[str]:
    modules = _Modules()
    kept = {k for f in files if (k := _kept(f)) is not None}
    return kept.union(*(modules.imports(f) for f in kept))


def _source_file(obj: object) -> str | None:
    try:
        return inspect.getsourcefile(inspect.unwrap(obj))  # type: ignore[arg-type]
    except TypeError:  # defined in C, or in no file
        return None


def factory_files(ref: ModelRef) -> set[str]:
    """The file of the function that builds ``ref`` and what it imports from its package. A
    user's module counts once it is imported (a ``file.py`` spec counts from the start)."""
    if ref.source is ModelSource.TIMM:
        timm = library("timm.models")
        known = timm.is_model(ref.name)
        files = [_source_file(timm.model_entrypoint(ref.name))] if known else []
    elif ref.source is ModelSource.TORCHVISION:
        models = library("torchvision.models")
        known = ref.name in models.list_models()
        files = [_source_file(models.get_model_builder(ref.name))] if known else []
    else:
        target = ref.name.rpartition(":")[0]
        if target.endswith(".py") or os.sep in target:
            files = [os.path.abspath(target)]
        else:
            files = [getattr(sys.modules.get(target), "__file__", None)]
    return _with_imports(f for f in files if f)


def module_files(model: nn.Module) -> set[str]:
    """The files of every class in the MRO of every module of ``model``, and their imports."""
    classes = {cls for module in model.modules() for cls in type(module).__mro__}
    return _with_imports(f for cls in classes if (f := _source_file(cls)))


def call_site_files(row: ModelRow) -> set[str]:
    """The files of the call sites a row records (its findings', its cost sites' and their fix
    sites'), found as attribution names them: relative to a ``sys.path`` entry, or absolute."""
    findings = row.offenders + row.parameter_conversions + row.format_neutral + row.regains
    sites = [f.call_site for f in findings]
    for cost_site in row.cost.sites if row.cost is not None else ():
        fix = cost_site.fix_site
        sites += [cost_site.call_site, fix.call_site if fix else None]
    files: set[str] = set()
    for call_site in sites:
        name = (call_site or "").rpartition(":")[0]
        if not name:
            continue
        candidates = [name] if os.path.isabs(name) else [os.path.join(e, name) for e in sys.path]
        found = next((c for c in candidates if os.path.isfile(c)), None)
        if (kept := _kept(found)) is not None:
            files.add(kept)
    return files


class FileDigests:
    """SHA-256 of files, each read once per sweep; None for a file that is gone."""

    def __init__(self) -> None:
        self._digests: dict[str, str | None] = {}

    def __call__(self, name: str) -> str | None:
        """The digest of a file named as ``portable`` names it."""
        if name not in self._digests:
            try:
                data = Path(_resolve(name)).read_bytes()
            except OSError:
                self._digests[name] = None
            else:
                self._digests[name] = hashlib.sha256(data).hexdigest()
        return self._digests[name]
