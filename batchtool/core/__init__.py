"""The bottom layer: errors, paths and object stores, randomness, memory budgets, options, executors."""
