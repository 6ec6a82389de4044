"""Sessions as data: ``Session`` (tensors, generator, locks, bytes), ``Budget``, the ``SessionStore``, and
``CustomTensor``. A leaf below the engine: nothing here runs a program."""
