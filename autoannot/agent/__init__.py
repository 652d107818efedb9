"""The agent's owner and what it puts in a process: ``Instrumentation``, the switches the
wrappers read, the patches and their proxies, the CUDA-graph patches, and ``autoannot
doctor``."""
