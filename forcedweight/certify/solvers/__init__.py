"""Exact solvers over all N keys and the certification that combines them."""
