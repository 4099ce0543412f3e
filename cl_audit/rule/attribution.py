"""Attribution of an event to the module that ran it and the model source line that called it,
and of a failure to the model line it came from.

Read from the Python stack only when an event is recorded, so the hot path pays nothing: the
innermost frame whose ``self`` is an ``nn.Module`` names the module, and the innermost frame
outside torch and cl_audit is the call site.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType

import torch
from torch import nn

from cl_audit.enums import Stage
from cl_audit.errors import ModelFailedError, first_line, marked

__all__ = [
    "Location", "ModuleNames", "call_site", "failure_site", "failure_summary", "frames_call_site",
    "locate", "model_failed", "own_code", "short_path",
]  # fmt: skip

# cl_audit's own folder (this file lies in cl_audit/rule/), read from ``__file__`` rather than by
# importing cl_audit, which would cycle
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# torch's package folder and cl_audit's: frames there are never call sites
_SKIPPED_DIRS = (os.path.dirname(os.path.abspath(torch.__file__)) + os.sep, _OWN_DIR)
# cl_audit's own frames (the engine's, the recorder's): none is a module's (no class of
# cl_audit is one), so their locals are never read for a ``self``


_OWN: list[Location] = []  # where cl-audit's own operations are placed, innermost last


@contextmanager
def own_code(label: str) -> Iterator[None]:
    """Operations cl-audit itself runs inside a model's audit (the default training loss) are
    placed at ``label``, never at a frame of the code that called cl-audit (a user's script,
    the CLI library): they are no call of the model's."""
    _OWN.append(Location(None, None, label))
    try:
        yield
    finally:
        _OWN.pop()


@dataclass(frozen=True)
class Location:
    module_path: str | None
    module_class: str | None
    call_site: str | None


class ModuleNames:
    """Dotted module paths (root ``""`` as in ``named_modules``), learned from each root seen."""

    def __init__(self, root: nn.Module | None = None) -> None:
        self._names: dict[int, str] = {}
        self._roots: list[nn.Module] = []  # keeps ids stable while the names are in use
        if root is not None:
            self.add_root(root)

    @property
    def roots(self) -> list[nn.Module]:
        """The roots named so far, in the order they were added (not to be changed)."""
        return self._roots

    def add_root(self, root: nn.Module) -> None:
        self._roots.append(root)
        for name, module in root.named_modules():
            self._names.setdefault(id(module), name)

    def get(self, module: nn.Module) -> str | None:
        return self._names.get(id(module))


def short_path(filename: str) -> str:
    """A file name relative to the ``sys.path`` entry that holds it, so reports are portable."""
    best = ""
    for entry in sys.path:
        if entry and filename.startswith(entry.rstrip(os.sep) + os.sep) and len(entry) > len(best):
            best = entry.rstrip(os.sep)
    return filename[len(best) + 1 :] if best else filename


def frames_call_site(frames: tuple[tuple[str, int], ...]) -> str | None:
    """The call site of a recorded stack (``(file, line)``, outermost first), as ``locate``
    names it: the innermost frame outside torch and cl_audit."""
    for filename, line in reversed(frames):
        if not filename.startswith(_SKIPPED_DIRS):
            return f"{short_path(filename)}:{line}"
    return None


def failure_site(error: BaseException) -> str | None:
    """The model's source line where ``error`` was raised: the innermost frame of its traceback
    outside torch and cl_audit."""
    frames = tuple((f.filename, f.lineno or 0) for f in traceback.extract_tb(error.__traceback__))
    return frames_call_site(frames)


def model_failed(
    stage: Stage, model: str, cause: BaseException, hint: str | None = None
) -> ModelFailedError:
    """The error a failure of ``model`` at ``stage`` raises, placed at the model line its
    traceback came from where no mark places it."""
    site = None if marked(cause)[1] is not None else failure_site(cause)
    return ModelFailedError(stage, model, cause, hint, site=site)


def failure_summary(error: BaseException) -> str:
    """One line: the operation and model line ``error`` came from, its type and first line
    (``Tensor.view at models/net.py:12: RuntimeError: view size is not compatible ...``)."""
    operation, site = marked(error)
    where = " at ".join(part for part in (operation, site or failure_site(error)) if part)
    text = first_line(error).rstrip(": ")
    return f"{where}: {text}" if where else text


def call_site(frame: FrameType | None) -> str | None:
    """The model-code call site of ``frame``: the innermost frame outside torch and cl_audit,
    walking out from it."""
    while frame is not None:
        if not frame.f_code.co_filename.startswith(_SKIPPED_DIRS):
            return f"{short_path(frame.f_code.co_filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def _frame_module(frame: FrameType) -> nn.Module | None:
    code = frame.f_code
    if code.co_argcount == 0 or code.co_varnames[0] != "self":
        return None
    candidate = frame.f_locals.get("self")
    return candidate if isinstance(candidate, nn.Module) else None


def locate(names: ModuleNames, frame: FrameType | None = None) -> Location:
    """Find the current module and the model-code call site, walking out from ``frame``."""
    if _OWN:
        return _OWN[-1]
    frame = frame if frame is not None else sys._getframe(1)
    call_site: str | None = None
    module: nn.Module | None = None
    outermost: nn.Module | None = None
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(_OWN_DIR):
            frame = frame.f_back
            continue
        if call_site is None and not filename.startswith(_SKIPPED_DIRS):
            call_site = f"{short_path(filename)}:{frame.f_lineno}"
        found = _frame_module(frame)
        if found is not None:
            module = module or found
            outermost = found
            if call_site is not None and names.get(module) is not None:
                break
        frame = frame.f_back
    if module is None:
        return Location(None, None, call_site)
    path = names.get(module)
    if path is None and outermost is not None:
        names.add_root(outermost)  # an audit without a known model: learn it from the stack
        path = names.get(module)
    return Location(path, type(module).__name__, call_site)
