"""The bubblewrap runtime: runs in fresh namespaces made by a root helper (execbox.sandbox.bwrap.helper)."""
