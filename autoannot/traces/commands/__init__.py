"""The trace tools' commands, one module each (``annotate``, ``summary``, ``skew``, ``report``,
``check``, ``plot``): what each decides about its inputs and outputs and what it prints, from an
``argparse.Namespace`` to an exit status (``common``: 0 done, 1 something left, 2 bad input).
The command line (``autoannot.cli``) parses and dispatches to them; nothing else is decided
there. The top layer of the trace tools: it uses the renderers, the analysis and the readers."""
