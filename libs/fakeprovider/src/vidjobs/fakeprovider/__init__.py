"""A provider that renders real clips locally and follows scripted scenarios: for `vidjobs up`, the tests and
the benchmarks. Never installed in a production image."""
