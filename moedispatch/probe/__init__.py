"""The machine as it is: GPUs, the installed AITER (read from its files), package versions.
"""
