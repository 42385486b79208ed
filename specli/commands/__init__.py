"""The command line: one module per command, the shared options built once (`options`), and
one table that turns every error into a line and an exit code (`app`)."""
