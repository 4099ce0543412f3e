"""The phases of one audit, each taking the run plan and returning its own section: the audited
run (``audited``), the NCHW comparison (``compare``) and Inductor's layout decisions
(``compile``); ``run.audit_module`` runs them and ``execution.assemble`` builds the report."""
