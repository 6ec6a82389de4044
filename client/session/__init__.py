"""Below the core's queue (``client/_core``'s ``SessionCore``): the session's rules, as pure helpers it imports.

``_routes`` (the server's op table as ``Route``s: which op a torch callable becomes), ``_steps`` (the
one builder of a step, from ``proto/messages``' types, and a queued step's ``Origin``), ``_answers``
(reading a program's answer), ``_callsite`` and ``_caller_memo`` (the user's line a step is reported
at, and its speed path), ``_queue_globals`` (torch's settings a program runs under),
``_checkpoint_regions`` (``torch.utils.checkpoint(use_reentrant=False)``'s regions), ``_recorder``
(what a capture records into), ``_unsupported`` (the error for a callable the table lacks),
``_banner`` (the one line a notebook shows on connect). The public ``Session``, which makes tensors,
is ``client/_session.py``, above the core.
"""
