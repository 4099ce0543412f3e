"""Running a model: the run plan (``plan``), how tensors are made, eager or fake (``tensors``),
model and input conversion (``convert``, ``inputs``), the training step (``training``), time
(``timing``), the ``audit()`` context manager (``audit_context``) and the report assembled from
the phases' sections (``assemble``)."""
