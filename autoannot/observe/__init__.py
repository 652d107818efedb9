"""How launches are seen: the proxies' wrappers, the annotation context, and the observers
below torch's Python API (torch's process-group hooks, the native observer's driver, the
Python layer)."""
