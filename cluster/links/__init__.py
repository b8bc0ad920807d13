"""Queues mastered on another node, reached over gRPC streams: the handle (remote_queue.py),
its link (link.py) and what it does while the master fails over (failover.py), the home
node's side (home.py), direct replies between nodes (reply_to.py), and the message codec
every stream between nodes shares (codec.py)."""
