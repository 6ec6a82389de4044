"""Where sessions live: the ``SessionBackend`` protocol (``protocol.py``) and its three implementations,
in this process (``local_sessions``), a worker process per tenant (``tenant_processes``), and Ray worker
actors (``ray_sessions``, an optional extra), with what they need (threads, channels, grants, the state volume).

Its modules (ARCHITECTURE.md maps the packages; what each module holds is told here):

- ``protocol.py``: ``SessionBackend``: what the routes ask of a backend
  (``tests/service/backends/test_backends.py`` checks the three); ``EncodedAnswer``: a program's answer
  (``ProgramAnswer``), encoded, as a backend hands it to the route
- ``local_sessions.py``: ``LocalSessions``: sessions in this process (a ``SessionStore`` and
  ``WorkerThreads``); admits a program (``engine/guards.py``), takes a slot, runs it on the session's
  thread; what the other backends run inside their workers
- ``workers.py``: ``WorkerThreads``: each session's programs run on one worker thread
- ``tenant_processes.py``: ``TenantProcesses``: the backend with a worker process per token (the default, one
  token or none too); the front routes by the caller, admits programs, counts sessions, grants bytes, stops
  idle workers
- ``step_deadline.py``: ``StepDeadline``: a program's step still running past the time limit (or its client's
  leaving) and a grace ends its tenant's worker, and the answer names the step
- ``tenant_spawn.py``: ``WorkerProcess``: the front's handle on one tenant's worker process (start it with a
  socketpair and an allow-listed environment, call it, stop or end it, say how it ended)
- ``tenant_worker.py``: ``python -m remote_autograd.service.backends.tenant_worker FD``: a tenant's worker
  process, ``LocalSessions`` behind a fixed table of methods
- ``tenant_channel.py``: ``Channel``: the private protocol between front and worker (calls by a fixed table of
  names, msgpack headers, bodies as they are, cancel)
- ``tenant_frames.py``: ``FrameProtocol``: its length-prefixed frames on the socket, each body received once
  into a buffer of its own
- ``byte_grants.py``: ``BytePool`` (the front's ``max_total_bytes``) and ``GrantedBudget`` (a worker's grant
  of it, grown on demand)
- ``state_volume.py``: sessions written to ``REMOTE_AUTOGRAD_STATE_DIR`` on SIGTERM and restored at start (one
  directory per tenant, the framed encoding)
- ``ray_sessions.py``, ``ray_worker.py``, ``token_ledger.py``: the Ray backend: the front's placement and
  routing, the worker actor (one per device slot and token), the cluster-wide bytes of each token

In the walk of one op:

The backend (``service/backends/local_sessions.py``; with a process per tenant the front's ``TenantProcesses``
passes the body to the tenant's worker, and with Ray the front passes it to a worker actor: each runs this
same ``LocalSessions``). ``answer_program`` has ``service/engine/guards.py`` decode the body
(``proto/codec.py``: msgpack, JSON or framed, at most ``max_list_values`` values built; on a thread when big),
check the step count and tensor dims and sizes it claims (``check_limits``: the one place these limits are
checked, on every path), and validate it into a ``Program`` (``proto/messages.py``). It takes a program slot
(in all, of the session, of the token), waits for the session's earlier programs (its ``gate``), and runs
``run_program`` on the session's worker thread (``service/backends/workers.py``).
``service/engine/runner.py``'s ``run_program`` takes the session's lock, answers a retried program id from
its memory, and otherwise runs the program (a stopped program's answer is kept the same way).
"""
