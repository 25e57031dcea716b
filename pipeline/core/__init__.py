"""The ground floor: atomic writes and provenance, paths, plots, process helpers, the phase decorator."""
