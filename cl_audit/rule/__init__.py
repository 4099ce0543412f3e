"""The rule and the layouts: a tensor's layout from its strides (``layout``), what a loss, a
regain and a copy are (``conversions``), and the module and source line an event belongs to
(``attribution``). Pure functions of strides, storage identity and provenance."""
