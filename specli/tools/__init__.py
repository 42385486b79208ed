"""Tool calls: which format a chat template's model writes calls in (formats.py), the
constraint that makes its calls parse (grammar.py), and the calls read back out of its text,
whole or as a stream goes (plan.py)."""
