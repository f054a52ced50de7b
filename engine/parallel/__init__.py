"""Several GPUs: the parallel layouts a model admits and the per-rank memory of each strategy."""
