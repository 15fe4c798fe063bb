"""User-space NFSv3 server adapter over the read-only filesystem model (see server.py)."""
