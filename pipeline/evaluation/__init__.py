"""Evaluation: grading into metrics, decoding strategies and step-level search, version comparison, reports."""
