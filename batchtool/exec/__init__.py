"""Running an operation: run settings, the driver, the exchange, the one write path, the engines."""
