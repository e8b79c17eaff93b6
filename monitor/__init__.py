"""Monitoring: the node agent (agent.py, standalone), report ingestion and per-node time series."""
