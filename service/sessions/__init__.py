"""Sessions as data: ``Session`` (tensors, generator, locks, bytes), ``Budget``, the ``SessionStore``, and
``CustomTensor``. A leaf below the engine: nothing here runs a program.

Its modules (ARCHITECTURE.md maps the packages; what each module holds is told here):

- ``store.py``: ``SessionStore`` and ``Session``: sessions by id and owner, idle expiry; ``CustomTensor``, what
  the server holds for each tensor id (value and grad); ``tenant_tag``
- ``storage_ledger.py``: ``StorageLedger`` and ``Budget``: a session's bytes by storage, not view (refcounted per storage; a
  step re-measures only the tensors it changed)
- ``tensor_snapshot.py``: a session's tensors as storages and layouts and back (views, strides, aliases,
  version counters; graphs marked lost)
"""
