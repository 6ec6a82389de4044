"""Below the core's queue (``client/_core``'s ``SessionCore``): the session's rules, as pure helpers it imports.

``_routes`` (the server's op table as ``Route``s: which op a torch callable becomes), ``_steps`` (the
one builder of a step, from ``proto/messages``' types, a queued step's ``Origin`` and the user's line it is
reported at, torch's settings a program runs under), ``_answers`` (reading a program's answer),
``_callsite`` (whether a call runs inside a user Function's forward),
``_checkpoint_regions`` (``torch.utils.checkpoint(use_reentrant=False)``'s regions), ``_recorder``
(what a capture records into), ``_unsupported`` (the error for a callable the table lacks),
``_banner`` (the one line a notebook shows on connect). The public ``Session``, which makes tensors,
is ``client/_session.py``, above the core.

Its modules (ARCHITECTURE.md maps the packages; what each module holds is told here):

- ``_routes.py``: which op of the server's table a torch callable or an op name becomes (``RouteTable``, from
  ``GET /v1/ops``)
- ``_steps.py``: ``make_step``, the one builder of a step (from ``proto/messages``' types; a field the
  type lacks refused where the step is built); ``Origin``: where a queued step came from; ``where``: the
  user's ``file:line`` (``op_where``: an op's, remembered per calling torch frame, a speed path beside that
  walk); ``QueueGlobals``: the client's torch settings a program carries: the default dtype per op
  (``call_op``; a change sends the queue first), the others when the queue gets its first op and when it is
  sent (a change between fails the queued steps), anomaly detection per backward and grad step; the user's
  line of the forward call an anomaly error names
- ``_answers.py``: reading a program's answer (results' metadata, a lost template)
- ``_callsite.py``: whether we are inside an ``autograd.Function``'s forward (it runs where torch records
  nothing; where torch records it, its backward goes to the server through ``dispatch/_user_functions``'s
  ``attach``, or it is refused)
- ``_frame_return.py``: a check run as a given frame returns (a per-thread profile function, set only while
  one is watched): ``Function.apply``'s return is where the caller's grad mode can be read
- ``_recorder.py``: ``Recorder``: a session stand-in into which a graph's remote calls queue their steps once,
  through the SDK's own eager path (the capture's graphs, a user Function's backward)
- ``_unsupported.py``: errors for calls the SDK does not run, named as the user wrote them
- ``_checkpoint_regions.py``: ``torch.utils.checkpoint(..., use_reentrant=False)``'s function told to the
  server: as a step is queued, the top of torch's saved-tensor hooks says which checkpoint call it belongs to;
  a change queues a ``checkpoint`` step (the call's tensor arguments and options, read from its frame) or a
  ``checkpoint_end`` step before it
- ``_banner.py``: the one-line banner on connect (notebooks)

In the walk of one op:

The queue (``client/_core.py``'s ``SessionCore``). ``SessionCore.enqueue`` appends the ``call`` step with an
``Origin`` (the user's line, for error messages, and what to do with the result). The queue is sent as one
program by ``SessionCore.flush`` when a value is needed (``item()`` queues a ``fetch`` step and waits for its
result), on ``sync()``, when the session's limits would be crossed, and on ``close()``.
"""
