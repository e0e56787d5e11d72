"""Spec texts several test files write."""

# A 4-core Ice Lake box with no scheduler: the smallest target the spec accepts with a named CPU.
CPU_TARGET = """\
apiVersion: modak/v1
kind: Target
name: cpu-box
cpu:
  microarchitecture: icelake
  cores_per_socket: 4
memory:
  size_gb: 16
"""
