"""Real runs on this machine: the CPU and CUDA profilers, GPU calibration, the data-dependent fallback."""
