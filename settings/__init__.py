"""settings: see docs/ARCHITECTURE.md."""
