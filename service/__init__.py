"""The remote-autograd service: a FastAPI app that runs programs of torch ops for sessions."""

from remote_autograd import __version__  # noqa: F401  (one version, the package's)
