"""Model construction: tiny from-scratch models for CPU runs and tests, and what the trainer and engines need to know
about a vision-language model (``multimodal``).

May import: torch, transformers and tokenizers only, nothing else of ``molt_train``; every other part of it may
import this package.
"""
