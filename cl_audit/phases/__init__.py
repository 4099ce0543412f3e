"""The phases of one audit, each taking the run plan and returning its own section: the audited
run (``audited``), the NCHW comparison (``compare``) and Inductor's layout decisions
(``compile``); ``cl_audit.run`` runs them and ``cl_audit.assemble`` builds the report."""
