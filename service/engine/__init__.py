"""The engine: a program admitted (decoded, bounded, validated), then run step by step against a session.

``programs.run_program`` is the entry (the retry memory, then ``runner.run_steps``); every call
step is checked on meta first (``meta_check``); ``answers`` says what a program answers with.
"""
