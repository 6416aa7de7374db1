"""A model of AITER's fused-MoE dispatch (lookup key, heuristics, kernel × bucket issues) and a lint of its tables.
"""
