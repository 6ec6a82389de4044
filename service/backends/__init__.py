"""Where sessions live: the ``SessionBackend`` protocol (``protocol.py``) and its three implementations,
in this process (``local_sessions``), a worker process per tenant (``tenant_processes``), and Ray worker
actors (``ray_sessions``, an optional extra), with what they need (threads, channels, grants, the state volume).
"""
