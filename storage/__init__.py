"""storage: see docs/ARCHITECTURE.md."""
