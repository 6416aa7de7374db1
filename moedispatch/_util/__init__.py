"""Small helpers with no domain knowledge: logging, did-you-mean, deadlines for plugin calls. Imports nothing of
moedispatch.
"""
