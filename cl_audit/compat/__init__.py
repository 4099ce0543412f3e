"""The one package that touches torch internals, each use behind a feature test.

cl-audit needs a few things torch has no public API for: the identity of a tensor's storage and
a view's base (``storage``), operators' names and traits (``operators``), the autograd node
running in a backward and the gradient scaler's kernels (``autograd``), fake tensors on a device
of our choosing (``fake_base``, ``fake_mode``, ``fake_shortcuts``, ``memo``), function modes
(``modes``), torch's pytree (``pytree``), error kinds (``failures``), CUDA's fused attention
(``attention``), the fake-CUDA probe (``cuda``), the profiler's raw events (``profiler_events``),
a backward run node by node (``backward``), Dynamo's capture and Inductor's layout decision
(``inductor``), torch's operator test database (``opinfo``) and process groups
(``process_group``). They live in this package and nowhere else. A torch that lacks one raises
``UsageError`` naming the feature when it is used (``versions.missing``; never an
``AttributeError`` from deep inside an audit; the profiler's raw events fall back to its parsed
ones), and fake CUDA checks itself with a probe of known answer before it predicts anything
(``cuda.fake_cuda_problem``).
"""
