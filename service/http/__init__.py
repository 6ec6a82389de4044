"""The HTTP face of the service: the app (``create_app``), its one middleware, the routes, auth, docs, metrics.

Thin by design: a route names its backend call and encodes the answer; decoding, limits and
validation of a program happen below it (``engine.guards``, reached through a backend).

Its modules (ARCHITECTURE.md maps the packages; what each module holds is told here):

- ``app.py``: ``create_app``: the backend, metrics and middleware wired, the routers included;
  ``make_backend`` picks the backend
- ``routes/``: one router per resource (``sessions.py``, ``tensors.py``, ``ops.py``, ``models.py``,
  ``health.py``, ``programs.py``); ``deps.py`` the FastAPI dependencies routes take (backend, metrics,
  caller), ``replies.py`` their answers' encoding, ``errors.py`` the exception handlers
- ``middleware.py``: ``Gatekeeper``: request id, bearer token, metrics, access log; calls the program route
  directly
- ``raw_route.py``: ``RawRoute``: a route documented like any other whose handler is plain ASGI
- ``http_protocol.py``: our transport tuning: uvicorn's httptools protocol with an idle timer from the start,
  a header-read timeout, a header-size limit and a minimum rate for an answer's reader (passed as ``http=``,
  nothing patched)
- ``auth.py``: ``Tokens``: bearer tokens, the operator token, the public paths
- ``waiting_answers.py``: ``WaitingAnswers``: the bytes of answers waiting for slow readers, charged to their
  tokens while they wait (``http_protocol.py`` charges them; a token at its share gets 429)
- ``metrics.py``, ``tenant_metrics.py``: Prometheus ``/metrics``; with a process per tenant, the figures
  gathered from the tenants' workers
- ``openapi.py``, ``docs_page.py``: the OpenAPI of the raw-body routes, and ``/docs`` served without any
  outside host (a first screen until a token reads the document; SPEC.md at ``/docs/SPEC.md``)

In the walk of one op:

The route (``service/http/middleware.py``, ``service/http/raw_route.py``,
``service/http/routes/programs.py``). The ``Gatekeeper`` checks the bearer token and, for the program route,
calls its ASGI handler (``answer_program_request``) directly, past the router. The handler checks the protocol
header, asks the backend whether the session exists (``check_session``, before reading a byte of the body),
reads the body within its size and time limits (``service/engine/guards.py``, ``read_body``), and hands it to
the backend's ``answer_program`` with a ``ProgramWatch``, which it cancels if the client disconnects meanwhile
(ASGI ``http.disconnect``). The route decodes nothing.
"""
