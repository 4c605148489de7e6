"""No tables."""
