"""Features built on the audit: the operator coverage index (``ops_index``), ``cl-audit bench``
(``bench``) and distributed training audits (``distributed``)."""
