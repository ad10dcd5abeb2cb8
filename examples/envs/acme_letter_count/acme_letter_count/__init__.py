"""``acme/letter-count-v1``: count how often a letter occurs in a word."""

from acme_letter_count.env import LetterCountEnv, grade

__all__ = ["LetterCountEnv", "grade"]
