"""The step traced on fake tensors: recorder, step, tracer, replay, accumulation, generation, CPU kernels."""
