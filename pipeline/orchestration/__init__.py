"""Orchestration: stages as Prefect flows, the repro flow, schedules, launchers, locks, profiles."""
