"""The SDK's way to a server: requests and answers, nothing about tensors.

``_transport`` (``Transport``: one session's requests, retried while the server is busy with
``_backoff``'s waits, answers read into one buffer), ``_lean`` (http:// requests on kept sockets, the
default), ``_http`` (the tuned httpx transport: https, and what the lean one hands it),
``_inprocess`` (``InProcessTransport``: the service's app in this process, no sockets),
``_embedded`` (the server ``connect()`` starts when no URL is given), ``_protocol_advice``
(a protocol mismatch as one error saying what to upgrade), ``_progress`` (notebook detection
and upload bars), ``_errors`` (``RemoteError``, ``SessionLost``).

Its modules (ARCHITECTURE.md maps the packages; what each module holds is told here):

- ``_transport.py``: ``Transport``: prebuilt requests over any ``httpx.BaseTransport``; framing of big bodies;
  retries; ``read_body``: an answer's whole body read into one buffer
- ``_backoff.py``: ``BusyWait``: how long to wait before resending a ``429`` (exponential, jittered, bounded)
- ``_lean.py``: ``LeanTransport``: the default; plain-http requests on kept-alive sockets, HTTP/1.1 written and
  read there (a speed path), the rest handed to ``TunedTransport``
- ``_http.py``: ``TunedTransport``: httpx's own transport over a tuned socket layer (the plain path: https too)
- ``_inprocess.py``: ``InProcessTransport``: the service's ASGI app in this process, no socket
  (``connect(transport=...)``)
- ``_embedded.py``: the embedded server of ``connect()`` without a URL (a child process)
- ``_progress.py``, ``_protocol_advice.py``: notebook detection and progress bars; errors on connect that say
  what to do (a protocol mismatch, a path the API is not under)
- ``_errors.py``: ``RemoteError``, ``SessionLost``

In the walk of one op:

The transport (``client/transport/_transport.py``). ``Transport.request`` encodes the program in msgpack
(framed, ``proto/codec.py``, when it carries big tensors) and posts it to ``/v1/sessions/{sid}/programs``
through the session's ``httpx.BaseTransport``: ``LeanTransport`` (``client/transport/_lean.py``) by default,
or ``InProcessTransport`` (``client/transport/_inprocess.py``), which hands the same request to the app in
this process.
"""
