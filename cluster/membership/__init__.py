"""Who is in the cluster: members and failure detection (members.py), members found by DNS
(discovery.py), and the leader's watch that records a member down (node_down.py)."""
