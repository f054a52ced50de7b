"""The ground floor: the user's error, units, progress, limits, bounded reads, atomic writes, resources, NVML."""
