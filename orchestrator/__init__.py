"""Raylane's domain: specs, states, routing, the store, and the loops that drive jobs.

Importing this package imports nothing heavy; ``specs`` and ``states`` need only
pydantic and yaml, so the client install can use them.
"""
