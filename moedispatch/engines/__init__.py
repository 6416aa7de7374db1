"""What an engine release does: its own choice, the launch recipes it can carry out, GPU layout, launch lint.
"""
