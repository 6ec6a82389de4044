"""A torch call on RemoteTensors made into a queued step: the one builder of steps.

``_dispatch`` (``call_op``: the arguments encoded, the outputs' metadata inferred, the step
queued; every op call of the SDK goes through it), ``_infer`` (outputs' shapes and dtypes by
rule, without torch), ``_outputs`` (which outputs are views of which inputs), ``_meta_memo``
(the speed path of inference: an answer remembered per call signature).
"""
