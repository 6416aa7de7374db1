"""A whole model planned: one Decision per layer, its JSON, what-if alternatives.
"""
