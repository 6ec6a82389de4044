"""One server session below the tensor type: its queue of steps, the op table it routes by.

``_session_core`` (``SessionCore``: the session's ids and its queue of steps, flushed as
programs; ``_Origin``: where a queued step came from), ``_routes`` (the server's op table as
``Route``s: which op a torch callable becomes), ``_callsite`` and ``_caller_memo`` (the user's
line a step is reported at, and its speed path), ``_unsupported`` (the error for a callable the
table lacks), ``_banner`` (the one line a notebook shows on connect). The public ``Session``,
which makes tensors, is ``client/_session.py``, above the tensor.
"""
