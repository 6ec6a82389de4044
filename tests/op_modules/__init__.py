"""Operator-supplied op modules used by tests (loaded with REMOTE_AUTOGRAD_OP_MODULES)."""
