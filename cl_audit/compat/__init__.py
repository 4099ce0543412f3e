"""The one package that touches torch internals, each use behind a feature test.

cl-audit needs a few things torch has no public API for: the identity of a tensor's storage and
a view's base (``storage``), operators' names, schemas and traits (``operators``), the autograd
node running in a backward, what a node-by-node backward reads of a node, and the gradient
scaler's kernels (``autograd``), torch's fake mode and fake tensors with the entry points the
fake engine (``cl_audit.fake``) builds on (``fake_base``), function modes (``modes``), torch's
pytree (``pytree``), error kinds (``failures``), CUDA's fused attention (``attention``), whether
CUDA is present (``cuda``), the profiler's raw events (``profiler_events``), Dynamo's capture and
Inductor's layout decision (``inductor``), torch's operator test database (``opinfo``) and
process groups (``process_group``). They live in this package and nowhere else (tested). A
torch that lacks one raises ``UsageError`` naming the feature when it is used
(``versions.missing``; never an ``AttributeError`` from deep inside an audit; the profiler's
raw events fall back to its parsed ones).
"""
