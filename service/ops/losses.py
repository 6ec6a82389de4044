"""losses ops (being written)."""

from __future__ import annotations
