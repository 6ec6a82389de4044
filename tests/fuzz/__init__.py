"""Fuzzing tools run by hand (``python -m tests.fuzz.values``), and in part by the tests."""
