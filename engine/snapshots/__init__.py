"""PyTorch memory snapshots of real runs: reading, validating, recording, the allocator check."""
