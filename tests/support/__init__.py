"""Plain helper modules shared by the tests (not pytest plugins)."""
