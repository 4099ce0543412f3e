"""Rendering of reports: terminal (rich), HTML, JUnit, sweep progress; ``wording`` says each
section's text once for the terminal and the HTML renderers."""
