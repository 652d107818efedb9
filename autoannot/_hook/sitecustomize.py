"""Start-up hook for environments where ``autoannot-startup.pth`` is not installed (a copied
tree, a zipapp, a read-only site-packages): put this directory first on ``PYTHONPATH``.

With ``AUTOANNOT`` set it turns the agent on; then it runs the ``sitecustomize`` it shadows,
if any, so an existing one keeps working. It imports neither torch nor wrapt.
"""

import os
import sys


def _chain_next_sitecustomize() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


if os.environ.get("AUTOANNOT", "").strip():  # autoannot._startup reads the value
    try:
        import autoannot._startup  # noqa: F401
    except Exception as exc:  # never stop the interpreter from starting
        print(f"autoannot: start-up hook failed: {exc!r}", file=sys.stderr)

_chain_next_sitecustomize()
