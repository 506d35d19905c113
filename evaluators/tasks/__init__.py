"""Native rayeval tasks and their registry."""
