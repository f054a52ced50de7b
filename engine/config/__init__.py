"""What a user configures: the run (TrainConfig), the optimizer table and the GPU catalogue."""
