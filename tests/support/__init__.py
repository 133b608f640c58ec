"""Helpers the tests share: servers, config builders, the test model, scripted doubles.

Test modules import from here and never from one another (tests/test_test_tree.py), so moving or
deleting a test never breaks another."""
