"""Model construction: tiny from-scratch models for CPU runs and tests."""
