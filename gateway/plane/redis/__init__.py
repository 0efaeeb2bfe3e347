"""The routing plane of many brokers on one Redis."""
