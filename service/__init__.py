"""The remote-autograd service: a FastAPI app that runs programs of torch ops for sessions."""

__version__ = "0.1.0"
