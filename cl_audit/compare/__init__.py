"""The channels_last run against NCHW: the cost sites and the verdict (``cost_sites``), the
terminal losses compared (``differential``), the known remedies (``remedies``) and the edits a
what-if run makes to try them (``whatif``)."""
