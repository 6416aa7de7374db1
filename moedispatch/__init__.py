"""moedispatch: which MoE kernel is correct on an AMD ROCm GPU, what padding it needs, and why."""
