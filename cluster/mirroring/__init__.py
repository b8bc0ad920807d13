"""Mirrored queues: the policy that places mirrors (policy.py), the master's side
(replicator.py, its link's phases in link_machine.py), the mirror's side (mirror.py), and
each node's record of its part in every mirrored queue (manager.py)."""
