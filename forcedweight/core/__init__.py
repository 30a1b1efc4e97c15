"""Pure float64 array code at the heart of the analysis: the operator, swaps, scores, statistics."""
