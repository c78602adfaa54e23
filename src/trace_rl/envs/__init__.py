"""Agentic environments behind one protocol (see base.py)."""
