"""Renderers: the explain table and JSON, the HTML page, compare, the support matrix. They format values only.
"""
