"""`haremq ctl` and management over the cluster port: the commands a node serves (server.py,
operations.py, quorum.py; their error in errors.py), the operator's client (client.py), and
what management reads of the cluster (management_view.py)."""
