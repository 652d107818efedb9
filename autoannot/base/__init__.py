"""What every part of the runtime leans on: its settings, what this torch has, locks that
survive a fork, the warnings it says, and hooks run when a module is imported."""
