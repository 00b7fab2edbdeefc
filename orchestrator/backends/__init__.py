"""Adapters to the engine: ``ray_jobs`` talks to Ray's Jobs API and node list."""
