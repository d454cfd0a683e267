"""GPU profiler and shipped step-latency tables.

Importing this package never imports torch: the measuring code (``profiles.measure``,
``profiles.torch_model``) imports it inside functions, so the simulator and the CPU tests run on a
machine without torch or CUDA. Table reading and writing (``simulator.latency.table``) is plain
Python.
"""
