"""The remote-autograd service: a FastAPI app that runs programs of torch ops for sessions.

Its modules (ARCHITECTURE.md maps the packages; what each module holds is told here):

- ``__main__.py``: ``python -m remote_autograd.service``: ``--help``, settings, logs, uvicorn (with
  ``service/http/http_protocol.py``), the startup line
- ``settings.py``, ``logs.py``: ``REMOTE_AUTOGRAD_*`` settings; JSON logs (saves and restores on a lifecycle
  logger the default level shows)
- ``step_histogram.py``: ``StepHistogram``: step times by op (a speed path for a labelled prometheus_client
  ``Histogram``)
- ``gc_freeze.py``: ``freeze_startup_objects``: a server process's startup objects (with what torch loads on
  first use) out of the collector's full walks (a speed path)
- ``openmp_wait.py``: ``settle``: a server on loopback (its clients on its machine) waits passively between
  OpenMP regions instead of spinning on their cores (``OMP_WAIT_POLICY=PASSIVE``, set before torch loads; an
  operator's own choice stands)
- ``process_guards.py``: what the server's processes set on themselves (Linux): not readable by other
  processes of the user (the front, each worker), a worker dying with its front, without capabilities, its
  private memory bounded

The layers:

The service is in packages layered as the walk goes, lowest first; each module imports only from its own
package or those below it, at the top of its file (``tests/service/test_layers.py`` checks it, and that no
top-level imports go round a circle). The few imports inside a function are listed in that test with their
reason (ray, an optional extra; the test-only ops; the command line parsed before torch is imported).

leaves     service/settings.py, logs.py, step_histogram.py, gc_freeze.py, openmp_wait.py
ops        service/ops/        the op table
sessions   service/sessions/   Session, budgets, the store, CustomTensor: data, nothing runs here
engine     service/engine/     a program admitted, then run step by step against a session
backends   service/backends/   where sessions live: SessionBackend and its three implementations
http       service/http/       the app, middleware, routes, auth, docs, metrics

Its packages, lowest layer first: ``ops/``, ``sessions/``, ``engine/``, ``backends/``, ``http/`` (each
package's ``__init__.py`` tells its modules).

A setting goes in ``settings.py`` and ``.env.example`` (and ``docs/limits.md`` where a client can meet it).
The compose files pass ``.env`` to the server as it is (``tests/e2e/test_deploy.py`` checks that every field
of ``Settings`` reaches it).
"""

from remote_autograd import __version__  # noqa: F401  (one version, the package's)
