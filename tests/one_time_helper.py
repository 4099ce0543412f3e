"""A helper module that does tensor work when it is imported, as a library's module-level code
may (``one_time_models.ImportsLazily`` imports it inside its forward)."""

import torch

TABLE = torch.zeros(64, 64)
for row in range(32):
    TABLE[row] = torch.arange(64.0) * row  # one small write per row, once
