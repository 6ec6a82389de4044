"""The op surface's generator: torch's own databases -> ``service/ops/surface.json`` (a developer tool).

Not part of the installed package (``pyproject.toml`` lists the packages it installs; ``tools`` is not
one): it imports torch's test databases (``torch.testing._internal``, which needs ``expecttest``) and
runs their samples, which a server never does. The server only reads the committed ``surface.json``
(``service/ops/surface.py``). ``python -m tools.derive_ops`` says whether the file is current;
``--write`` rewrites it (see ``derive.py``).
"""
