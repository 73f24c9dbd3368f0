"""Helpers shipped for tests of slatepy and of applications embedding it."""
