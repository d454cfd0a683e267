"""Workloads: arrival processes, length distributions and trace loaders.

The simulator consumes only ``RequestSpec`` rows (see ``workloads.spec``).
"""
