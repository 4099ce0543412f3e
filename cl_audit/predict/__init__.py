"""Predicting a device without it: fake tensors (``fake_tensors``) and what they are known to
get wrong per torch release and device, with the measured kernel-copy tables
(``divergences``, ``divergences.json``, ``kernel_copies.json``)."""
