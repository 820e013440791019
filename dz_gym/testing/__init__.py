"""Test doubles that users' own tests may want too, kept apart from the real backends.

Each module is one double and says what it does not cover; nothing here is imported by the package's
runtime code paths, and importing this package imports none of its modules.
"""
