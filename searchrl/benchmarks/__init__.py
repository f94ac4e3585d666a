"""searchrl.benchmarks."""
