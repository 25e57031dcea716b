"""Repository root marker for pytest: `pipeline` and `stages` import from here."""
