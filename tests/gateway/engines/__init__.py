"""Tests of each engine's own behaviour (the shared contract is in tests/conformance/)."""
