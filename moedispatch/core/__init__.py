"""Values every layer shares: Reason, MoELayer/QuantSpec, Capabilities, Backend/Verdict/Padding, Decision, the
errors, the plugin hook specification. Imports nothing of moedispatch but ``_util``.
"""
