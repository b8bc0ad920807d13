"""Runnable examples for the HareMQ Spark connector; see pipeline/README.md."""
