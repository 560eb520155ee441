"""The demo stack and its seed data, and the gateway/simulator processes that the demo,
the tests and the benchmarks start. Nothing in the product imports this package."""
