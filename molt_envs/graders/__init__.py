"""Reward graders shared by built-in environments."""
