"""attribution."""
