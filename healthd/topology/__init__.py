"""topology."""
