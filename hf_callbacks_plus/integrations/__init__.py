"""Integrations."""
