"""capability_db and AITER's tuned CSVs, read as data (no probing, no selection).
"""
