"""Questions over estimates: the estimator, what fits (batch, context), recommendations, diffs."""
