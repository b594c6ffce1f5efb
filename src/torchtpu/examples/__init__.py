"""Small models used by the demo, tests and benchmarks."""
