"""Run at interpreter start-up when AUTOANNOT is set (by ``autoannot-startup.pth`` or the
``sitecustomize`` of ``autoannot/_hook``): turn the agent on. Imports neither torch nor wrapt."""

from autoannot.patching import enable

enable()
