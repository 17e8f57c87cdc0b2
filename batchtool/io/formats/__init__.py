"""Shard formats: each one module (or package) behind one interface (base.py), listed by name in registry.py."""
