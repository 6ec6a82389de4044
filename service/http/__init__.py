"""The HTTP face of the service: the app (``create_app``), its one middleware, the routes, auth, docs, metrics.

Thin by design: a route names its backend call and encodes the answer; decoding, limits and
validation of a program happen below it (``engine.admission``, reached through a backend).
"""
