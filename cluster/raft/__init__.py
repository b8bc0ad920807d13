"""Raft for the cluster's metadata log: the pure rules (rules.py) and machine (machine.py,
messages.py, state.py), the durable state (storage.py), and the shell that runs them on
asyncio and gRPC (shell.py)."""
