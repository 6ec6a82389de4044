"""The SDK's way to a server: requests and answers, nothing about tensors.

``_transport`` (``Transport``: one session's requests, retried while the server is busy with
``_backoff``'s waits, answers read by ``_answer_body``), ``_http`` (the tuned socket transport),
``_inprocess`` (``InProcessTransport``: the service's app in this process, no sockets),
``_embedded`` (the server ``connect()`` starts when no URL is given), ``_protocol_advice``
(a protocol mismatch as one error saying what to upgrade), ``_progress`` (notebook detection
and upload bars), ``_errors`` (``RemoteError``, ``SessionLost``).
"""
