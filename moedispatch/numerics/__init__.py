"""Numerics (torch, imported lazily; never imported by explain or selection)."""
