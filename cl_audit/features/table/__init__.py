"""``cl-audit table``: this machine's operation time table, measured (``measure``), from the
host's cost per operation (``host``), the probes (``probes``), convolutions (``convs``) and the
models it is made for (``targets``), logged and written as it goes (``document``)."""
