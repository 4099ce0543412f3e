"""The operator coverage index (``cl-audit ops``): what each operator returns for channels_last
input, from the sample inputs of torch's own operator database (``cl_audit.compat.opinfo``).

A sample counts when its first input is a 4-D or 5-D floating-point tensor. It runs twice: as
the database gives it (NCHW), then with every 4-D and 5-D floating-point tensor among its
arguments made channels_last (channels_last_3d), as a channels_last model hands them over (the
data and the convolution weights alike). A sample that fails in NCHW is not counted. The
channels_last call's first 4-D or 5-D output then says what the operator does
(``OpBehaviour``): it keeps channels_last, loses it (NCHW strides), returns other strides, only
follows its input (the NCHW call's output is not NCHW either: a view or a reordering), refuses
(raises), or the input or output is both orders at once: size-1 dimensions, or no elements
(ambiguous, naming which). An operator's behaviour is the worst of its samples', with that
sample as the example; every count is kept.

The index as a report is ``cl_audit.report.ops_report``; here: running it (``probe``), comparing two
(``diff``) and reading audits against it (``ranking``).
"""
