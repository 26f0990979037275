"""Tidal's base: errors, units and the spec grammar that every other package shares.

A leaf: it imports nothing of Tidal, so `forecaster/` and `adaptive/` can both build on
it without importing each other.
"""
