"""The fake-tensor engine: an audit's forward and training step run on fake tensors, layouts from
the operators' meta functions and nothing computed, on a device of the user's choosing (a
prediction; ``--fake``, sweeps).

``mode`` is the fake mode (its layers, the shortcuts where torch's own path is slow or lays a
tensor out otherwise than the kernels, real tensors computed as eager does), ``shortcuts`` the
operations it answers itself, ``memo`` the outputs it remembers, ``backward`` a backward run
node by node from Python (``--train --fake``), ``kernels`` the kernel-source corrections of a
fake run (what the CUDA kernels do that the meta functions do not), and ``cuda_probe`` whether
fake CUDA predicts honestly on this torch. The engine builds on torch's fake tensors, which have
no public API, through ``cl_audit.compat`` alone (``fake_base``, ``operators``, ``autograd``,
``storage``): this package touches no torch internal itself (tests/test_architecture.py).
"""
