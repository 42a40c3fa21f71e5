"""Independent reference implementations the tests (and benchmarks) check the product against."""
