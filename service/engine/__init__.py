"""The engine: a program admitted (decoded, bounded, validated), then run step by step against a session.

``runner.run_program`` is the entry (the retry memory, then ``runner.run_steps``); every call
step is checked on meta first (``meta_check``); ``answers`` says what a program answers with.

Its modules (ARCHITECTURE.md maps the packages; what each module holds is told here):

- ``guards.py``: admission: ``read_body`` (size and time bounded; ``BodyBytes``: all bodies held together),
  ``check_limits`` (claims capped before arithmetic), ``ProgramSlots`` (in all, per session, per token);
  ``admit_program``: a body made a ``Program`` (bounded decoding, ``check_limits``, validation; on a thread
  when the body is big)
- ``program_watch.py``: ``ProgramWatch``: a program's time limit and its cancel (client gone), checked by the
  runner between steps
- ``runner.py``: ``run_program``: the retry memory by program id (a retried id gets its first answer), then
  the steps, under the session's lock (``read_tensor`` too); ``run_steps``: a program's frame (its turn of the
  process-global torch settings, ``TURNS``; the context its ops read; its checker) and ``StepLoop``, its steps
  in order from any step to any other, each atomic, with the handlers of ``call``, ``fetch`` and ``free``
- ``run_ahead.py``: a program sent with ``answer_early`` (a compiled step's) answered once the fetches at its
  end are known, its backward and optimizer run after the answer (``settle``), a failure of theirs told to
  the next program (a speed path; the plain path runs every step before answering)
- ``step_kinds.py``: the handlers of the other simple step kinds (put, set_grad, set_requires_grad,
  retain_grad) and a call's in-place run
- ``templates.py``: the ``template`` and ``run_template`` steps: a graph ``torch.compile`` captured, validated
  once and kept by the session, run with other inputs and numbers by one small step; ``Template.runner`` is
  where a template's way of running is chosen (``run_plainly``: each step through the runner's handlers)
- ``functorch_regions.py``: a template's ``torch.func`` spans (``functorch`` steps): checked when it is
  defined (``Scopes``), each run as one step by torch's functorch (``run_region``): on meta first (torch's
  checks, its work and bytes held before any kernel), its levels the server's own and always left
- ``region_memo.py``: ``RegionMemo``: what a ``torch.func`` span's meta pass answered (its work and bytes), by
  the layouts of what it reads (a speed path)
- ``autograd_steps.py``: the ``backward`` and ``grad`` steps (a graph a restart lost refused before it runs);
  each holds its run on the session while autograd runs (a user Function's node needs it); their ``capture``:
  the gradients reaching client-run nodes kept for the client (a walk that meets one uncaptured refused);
  ``owned``: a fresh grad becomes ``.grad`` without a copy (a speed path; the plain path clones)
- ``user_functions.py``: the ``function`` step: a user's ``autograd.Function`` applied on the client made one
  node of the session's graph (a generic server-side Function over the forward's outputs, saving what its
  backward reads), whose backward runs the template the client recorded (``once_differentiable`` as torch's);
  with ``client_backward``, a node that cuts the graph (an anchor leaf of its own as its only input), named
  for the captures of backward and grad steps
- ``module_hooks.py``: a backward or grad step's ``module_hooks``: torch's module backward hooks that return
  new gradients, one template per module call run in its outputs' node (with the gradients it is given) and
  its inputs' node (with those and the ones it passes on), passing on what replaces them
- ``tensor_hooks.py``: a backward or grad step's ``hooks``: each registered on its session tensor with torch's
  ``register_hook`` for that step alone, running its template inside autograd, or keeping the gradient
  (observe) or noting where the leaf accumulates (post_accumulate); its ``node_hooks``: on the named nodes of
  function steps, keeping their gradients
- ``autograd_graph.py``: walks of an autograd graph: the nodes a backward could run
- ``anomaly.py``: ``torch.autograd.detect_anomaly()`` for one backward, without torch's process-global switch:
  each node's gradients checked for NaN with torch's words, and the call step that made a failing node named
  (``Forwards``)
- ``autocast.py``: a call step under ``torch.autocast``: its inputs cast as torch's autocast casts them
- ``load_step.py``: the ``load`` step: new tensors read from a safetensors file of the model directory
- ``model_dir.py``: the model directory (``REMOTE_AUTOGRAD_MODEL_DIR``): names checked, files listed, headers
  and tensors read with safetensors
- ``speed_caches.py``: ``Caches``: what a session's speed paths remember between programs (plans, keys
  sighted once, CUDA-graph captures), kept beside the session and dropped with it
- ``program_plan.py``: ``PlanRun``: a session's repeated program, its calls' layout checks answered by their
  pattern (which step made each argument, its scalars) instead of each call's memo key (a speed path;
  ``REMOTE_AUTOGRAD_REPLAY=off``: the plain path)
- ``kept_storages.py``: ``keeps_storages``: the in-place steps (torch's elementwise arithmetic, the in-place
  foreach ops) after which the runner counts no byte again (a speed path; the plain path re-counts every
  tensor an in-place step names)
- ``graph_steps.py``: a repeated program captured once and launched again as a CUDA graph
  (``REMOTE_AUTOGRAD_CUDA_GRAPHS``, off by default): which programs, when, each capture's lifetime, and the
  Python a replay still does (ids, grads, version counts, bytes)
- ``graph_signature.py``: ``signature``: which programs a graph can replay exactly, and the key of one (ops,
  floats by value, the session's tensors by address)
- ``graph_capture.py``: ``CudaGraph`` (torch's ``CUDAGraph``) and ``RecordedGraph``, a stand-in with a CUDA
  graph's rules on any device, for the tests; ``HostReads``, which watches a warm-up run for a value read on
  the host
- ``meta_check.py``: ``check_call``: every call derived on the meta device before its kernel runs (torch's
  argument checks, without touching memory), and what it needs (``Needs``: the bytes its new outputs will
  hold, charged first; its largest output's elements; its work); memoized by the arguments' layouts
- ``step_cost.py``: a call's work counted on meta as ``meta_check`` derives it (a dispatch mode), and
  ``hold``: refused before its kernel runs past ``max_step_flops`` or past what the program's time left is
  worth
- ``cost_formulas.py``: the work of one aten op from its shapes: torch's FLOP formulas, ours (sorts,
  factorizations, pools, distances, FFTs), the elements any other op touches; a data-dependent entry's from
  its bound
- ``replayable.py``: ``replayable_call``: which calls a capture may run without the runner's handler (torch's
  deterministic ops, a basic index, a factory): one rule for ``graph_signature`` and ``template_graph``
- ``template_graph.py``: a template's steps as one FX graph for a variant (its inputs' layouts, its numbers by
  value), built on fake tensors; what a run does after it (grads given, cleared); ``Unfit`` for what a graph
  cannot hold
- ``template_compile.py``: ``Compiler``: variants compiled by inductor (``compile_fx``) on one background
  thread, cached per tenant, within its compile budget; ``compiler_missing``
- ``compiled_templates.py``: ``runner_for``: a template's runner, compiled where its variant is ready and
  plain otherwise (``REMOTE_AUTOGRAD_COMPILE``: off, on, auto); a compiled run with the plain run's checks,
  limits and charges (a speed path)
- ``error_text.py``: ``scrubbed``: what of an exception's text reaches a client (torch's words, without
  addresses or a C++ backtrace)
- ``values.py``: what every handler shares: ``ProgramRun`` (what it is given besides its step: session,
  settings, the answer's format), step arguments resolved (``{ref}``, ``{grad_of}``, ...), outputs stored,
  bytes counted; ``counting_saved``: autograd's saved-tensor hooks around a program, so what a graph saves
  counts while the graph keeps it
- ``checkpoint_regions.py``: the ``checkpoint`` / ``checkpoint_end`` steps: a non-reentrant checkpoint's
  region run under torch's own ``_checkpoint_hook`` (what its ops save is dropped), its steps recorded and run
  again by the frame's recomputation at the backward, on its saved inputs and the tensors it read, with the
  generator of its start; open regions' hooks pushed again around each program
- ``answers.py``: fetched tensors in answers, and what the retry cache keeps

In the walk of one op:

The runner (``service/engine/runner.py``). ``run_steps`` runs the steps in order (asking the ``ProgramWatch``
before each whether the program must stop there: its time limit, its client gone) through its handler table,
one function per step kind, each given the step and the program's ``ProgramRun``
(``service/engine/values.py``). The ``call`` handler resolves the op name in ``OP_TABLE``
(``service/ops/_registry.py``, ``OpTable.resolve``: ``Tensor.add_`` is torch's own ``torch.Tensor.add_``,
``add_`` the same by its short name), turns wire values back into tensors and Python values
(``service/engine/values.py``), checks the call on the meta device (``service/engine/meta_check.py``: no
kernel sees arguments torch would refuse, the bytes of its outputs are charged to the session before they
exist, and their elements and the call's work, counted as it runs on meta, ``service/engine/step_cost.py``,
are held to their limits), and calls the op.

Captures: three ways to run a repeated step, becoming one.

A repeated program is checked by its plan (``program_plan.py``), captured as a CUDA graph on a GPU
(``graph_steps.py``, ``graph_signature.py``, ``graph_capture.py``), and a template (``templates.py``, what
``torch.compile(..., backend="remote")`` sends) may run compiled (``compiled_templates.py``). The compiled way
adds no mechanism of its own: it is one of the ways a template runs, chosen per template at its definition
(``Template.runner``), and what a capture may run without the runner is one rule for the CUDA graph and the
compiled template (``replayable.py``). What folding the other two into templates takes, so that the server has
one capture mechanism:

1. *Promotion*: a program that repeats under one key (the plan's: its step kinds and ops, its pattern of
   origins) becomes an implicit template of the session. Its inputs are the session tensors it reads (the
   plan's ``("s", n)`` origins) and its puts; its steps its calls, backward and grad settings; its outputs
   what it fetches or keeps; frees and fetches run after it. ``bench/server_compile.py``'s ``program_case``
   does this conversion (offline, for the bench).
2. *The plan is the template's plain way* (done): ``run_plainly`` runs with a plan the template keeps
   (``Template.plans``), so a run whose bound layouts match the last run's is checked by ``check_planned``; a
   number a run binds is in the pattern by its value.
3. *The CUDA graph becomes the template's captured way* on a GPU: ``graph_steps``' signature is a variant's
   key plus the inputs' addresses; its slots and the Python a replay does (ids, grads, version counts, bytes)
   move behind the runner seam. Or it goes, for inductor's cudagraph trees (``REMOTE_AUTOGRAD_COMPILE`` with
   ``REMOTE_AUTOGRAD_CUDA_GRAPHS=on``), once ``bench/gpu_check.sh`` has compared them on a GPU.
4. *The answers*: a promoted program must still answer step by step (one result per step, the error at its
   step, the steps before it done): ``test_program_plan.py``, ``test_graph_steps.py`` and
   ``test_fast_paths.py`` compare those byte for byte and stay the net. A promoted run answers from the
   template run only under ``omit_known_meta`` (every step's result ``None``, as ``graph_steps`` requires
   today), and runs the program plainly when a step fails, as a replay does.

Not done in this round: the promotion changes ``run_steps``' entry, where the plan and the CUDA-graph capture
were being changed for the step's cost at the same time.
"""
