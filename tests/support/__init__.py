"""Helpers the tests share (and benchmarks/tools/fuzz.py): small ONNX graphs, the fuzzing strategies and checks."""
