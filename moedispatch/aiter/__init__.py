"""A model of AITER's fused-MoE dispatch (lookup key, heuristics, kernel × bucket issues) and a lint of its tables.

:mod:`moedispatch.aiter.dispatch` plans a layer's dispatch and lists which module of this package holds what.
"""
