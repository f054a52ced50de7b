"""The result types every view renders (Trace, Estimate), their instants and module-row grouping."""
