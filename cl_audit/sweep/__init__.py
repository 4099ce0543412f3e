"""Registry sweeps: selection and sharding, isolated workers, merge and baselines."""
