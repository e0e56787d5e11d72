"""Test suite of modak (a package, so that tests and benchmarks import its helpers as ``tests.support``)."""
