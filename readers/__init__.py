"""readers: see docs/ARCHITECTURE.md."""
