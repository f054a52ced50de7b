"""The CUDA target: calibration profiles, kernel scratch and choices, allocator model, device overlay."""
