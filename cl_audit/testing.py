"""The assertion for test suites, where users import it (``cl_audit.testing``); it lives with
the other integrations, in ``cl_audit.integrations.assertion``."""

from cl_audit.integrations.assertion import assert_keeps_channels_last

__all__ = ["assert_keeps_channels_last"]
